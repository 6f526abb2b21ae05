export function registerDevCommand(_p: import("commander").Command): void {}
