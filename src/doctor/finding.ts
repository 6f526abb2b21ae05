export type Level = 'ok' | 'warn' | 'problem';

export interface Finding {
  level: Level;
  check: string;
  detail: string;
  /** The command that fixes it. */
  fix?: string;
  /** A stable snake_case code on every warn and problem (data/doctor-report.ts). */
  code?: string;
}

/** Collects findings; a warn or problem always carries its code. */
export class Findings {
  readonly list: Finding[] = [];

  ok(check: string, detail: string): void {
    this.list.push({ level: 'ok', check, detail });
  }

  warn(code: string, check: string, detail: string, fix?: string): void {
    this.list.push({ level: 'warn', check, detail, ...(fix ? { fix } : {}), code });
  }

  problem(code: string, check: string, detail: string, fix?: string): void {
    this.list.push({ level: 'problem', check, detail, ...(fix ? { fix } : {}), code });
  }
}

/** "3 min ago", "2 h ago": for a person reading a time next to it. */
export function ago(thenMs: number, nowMs: number): string {
  const s = Math.max(0, Math.round((nowMs - thenMs) / 1000));
  if (s < 120) return `${s} s ago`;
  if (s < 7200) return `${Math.round(s / 60)} min ago`;
  if (s < 172_800) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86_400)} d ago`;
}

/** "in 5 h 3 min", "expired 2 min ago". */
export function untilText(thenMs: number, nowMs: number): string {
  if (thenMs <= nowMs) return `expired ${ago(thenMs, nowMs)}`;
  const m = Math.floor((thenMs - nowMs) / 60_000);
  if (m < 1) return `in ${Math.ceil((thenMs - nowMs) / 1000)} s`;
  if (m < 120) return `in ${m} min`;
  return `in ${Math.floor(m / 60)} h ${m % 60} min`;
}
