/** `@NAME@` slots in the packaging templates; a slot without a value is a build error, never left in a script. */
export function fill(template: string, values: Record<string, string>): string {
  return template.replace(/@([A-Z_]+)@/g, (whole, key: string) => {
    const value = values[key];
    if (value === undefined) throw new Error(`packaging template: no value for ${whole}`);
    return value;
  });
}
