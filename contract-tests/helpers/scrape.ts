import { request } from 'undici';

/** A Prometheus scrape read back into samples, for tests that assert exact counts. */

export type Labels = Record<string, string>;
export interface Sample {
  name: string;
  labels: Labels;
  value: number;
}

/** Prometheus text exposition → samples (the subset prom-client writes). */
export function parse(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m?.[1] || !m[3]) throw new Error(`unparseable metrics line: ${line}`);
    const labels: Labels = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1] as string] = l[2] as string;
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

export class Scrape {
  constructor(
    readonly text: string,
    readonly samples: Sample[],
  ) {}

  /** The samples named `name` whose labels include `labels`. */
  find(name: string, labels: Labels = {}): Sample[] {
    return this.samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  }

  /** The one sample named `name` with exactly these labels (besides `part`); 0 when absent. */
  value(name: string, labels: Labels = {}): number {
    const hits = this.samples.filter(
      (s) => s.name === name && Object.keys(s.labels).filter((k) => k !== 'part').length === Object.keys(labels).length && Object.entries(labels).every(([k, v]) => s.labels[k] === v),
    );
    if (hits.length > 1) throw new Error(`${name} ${JSON.stringify(labels)} matched ${hits.length} series`);
    return hits[0]?.value ?? 0;
  }
}

const MAX_SCRAPE_BYTES = 4 * 1024 * 1024;

export async function scrape(port: number): Promise<Scrape> {
  const res = await request(`http://127.0.0.1:${port}/metrics`);
  const text = await res.body.text();
  if (res.statusCode !== 200) throw new Error(`scrape answered ${res.statusCode}`);
  if (text.length > MAX_SCRAPE_BYTES) throw new Error(`scrape of ${text.length} bytes`);
  return new Scrape(text, parse(text));
}

