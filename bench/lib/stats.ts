/** Percentiles and the median (min–max) summaries the report is made of. */

/** Nearest-rank percentile of an ascending array. */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))] as number;
}

export function median(xs: readonly number[]): number {
  const s = [...xs].filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const mid = Math.floor(s.length / 2);
  return s.length % 2 ? (s[mid] as number) : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
}

export interface Summary {
  median: number;
  min: number;
  max: number;
  n: number;
  values: number[];
}

export function summarize(values: readonly (number | undefined)[]): Summary {
  const xs = values.filter((x): x is number => x !== undefined && Number.isFinite(x));
  return {
    median: median(xs),
    min: xs.length ? Math.min(...xs) : NaN,
    max: xs.length ? Math.max(...xs) : NaN,
    n: xs.length,
    values: xs,
  };
}
