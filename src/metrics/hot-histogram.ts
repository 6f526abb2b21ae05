import { Histogram, type LabelValues, type MetricObjectWithValues, type MetricValueWithName, type Registry } from 'prom-client';

/** One label set's counts: `buckets[i]` counts observations in (bound[i-1], bound[i]], the last slot those above every bound. */
export interface HotSeries {
  readonly buckets: number[];
  sum: number;
  count: number;
}

interface Entry<T extends string> {
  labels: LabelValues<T>;
  series: HotSeries;
}

/** A sample as prom-client's registry renders it: `labels` first, then the series' own `sharedLabels`. */
interface Sample<T extends string> {
  metricName: string;
  labels: { le?: number | string };
  sharedLabels: LabelValues<T>;
  value: number;
}

export interface HotHistogramOptions<T extends string> {
  name: string;
  help: string;
  labelNames: readonly T[];
  buckets: readonly number[];
  registers: Registry[];
}

/**
 * A prom-client histogram for the per-request path: the caller looks a series up once per
 * label set by a key it builds from its own small, fixed label values, and an observation
 * is an array increment. prom-client's `observe` validates the label names, hashes the
 * label object and allocates on every call; on the forwarder's hot path that was most of
 * what metrics cost (docs/metrics.md, "Cost"). The exposition is still prom-client's: its
 * registry renders what this returns, buckets made cumulative only at the scrape.
 */
export class HotHistogram<T extends string> extends Histogram<T> {
  private readonly metricName: string;
  private readonly helpText: string;
  private readonly bounds: readonly number[];
  private readonly entries = new Map<number, Entry<T>>();

  constructor(options: HotHistogramOptions<T>) {
    super({ name: options.name, help: options.help, labelNames: options.labelNames, buckets: [...options.buckets], registers: options.registers });
    this.metricName = options.name;
    this.helpText = options.help;
    this.bounds = [...options.buckets].sort((a, b) => a - b);
    // prom-client's constructor sets `observe` on the instance, which would hide ours.
    Reflect.deleteProperty(this, 'observe');
  }

  /**
   * The series a key names, if made. A key names one label set and one only; callers
   * build it from indices into fixed or capped sets (src/metrics/labels.ts), a number, so
   * the lookup hashes nothing and the series stay bounded.
   */
  seriesAt(key: number): HotSeries | undefined {
    return this.entries.get(key)?.series;
  }

  /** Makes the series `key` names, with its labels (once per label set). */
  addSeries(key: number, labels: LabelValues<T>): HotSeries {
    const entry = { labels, series: { buckets: new Array<number>(this.bounds.length + 1).fill(0), sum: 0, count: 0 } };
    this.entries.set(key, entry);
    return entry.series;
  }

  /** Counts one observation of `seconds` into a series from `seriesAt()`/`addSeries()`. */
  record(series: HotSeries, seconds: number): void {
    const bounds = this.bounds;
    let i = 0;
    while (i < bounds.length && seconds > (bounds[i] as number)) i++;
    series.buckets[i] = (series.buckets[i] as number) + 1;
    series.sum += seconds;
    series.count += 1;
  }

  // prom-client's own ways in keep state this class does not read: refuse them rather than
  // count into a series no scrape shows (a key made of the labels alone could not find the
  // series a caller made with its own key).
  override observe(): never {
    throw new TypeError(`${this.metricName}: use seriesAt()/addSeries() and record()`);
  }

  override labels(): never {
    throw new TypeError(`${this.metricName}: use seriesAt()/addSeries() and record()`);
  }

  override startTimer(): never {
    throw new TypeError(`${this.metricName}: use seriesAt()/addSeries() and record()`);
  }

  override zero(): never {
    throw new TypeError(`${this.metricName}: use seriesAt()/addSeries() and record()`);
  }

  override remove(): never {
    throw new TypeError(`${this.metricName}: use seriesAt()/addSeries() and record()`);
  }

  override reset(): void {
    // prom-client's constructor calls reset() before this class's fields exist.
    (this.entries as Map<number, Entry<T>> | undefined)?.clear();
  }

  /** What the registry renders: prom-client asks for this before `get()`. */
  async getForPromString(): Promise<MetricObjectWithValues<MetricValueWithName<T>>> {
    return this.exposition(this.samples());
  }

  override async get(): Promise<MetricObjectWithValues<MetricValueWithName<T>>> {
    return this.exposition(this.samples().map(({ metricName, labels, sharedLabels, value }) => ({ metricName, value, labels: { ...labels, ...sharedLabels } })));
  }

  private samples(): Sample<T>[] {
    const out: Sample<T>[] = [];
    const bucket = `${this.metricName}_bucket`;
    for (const { labels, series } of this.entries.values()) {
      let cumulative = 0;
      this.bounds.forEach((le, i) => {
        cumulative += series.buckets[i] as number;
        out.push({ metricName: bucket, labels: { le }, sharedLabels: labels, value: cumulative });
      });
      out.push({ metricName: bucket, labels: { le: '+Inf' }, sharedLabels: labels, value: series.count });
      out.push({ metricName: `${this.metricName}_sum`, labels: {}, sharedLabels: labels, value: series.sum });
      out.push({ metricName: `${this.metricName}_count`, labels: {}, sharedLabels: labels, value: series.count });
    }
    return out;
  }

  private exposition(values: object[]): MetricObjectWithValues<MetricValueWithName<T>> {
    const metric = { name: this.metricName, help: this.helpText, type: 'histogram', aggregator: 'sum', values };
    // prom-client's typings declare `type` as an enum its JavaScript never exports (the
    // registry reads the string) and the samples without `sharedLabels`.
    return metric as unknown as MetricObjectWithValues<MetricValueWithName<T>>;
  }
}
