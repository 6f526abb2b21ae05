import type { Registry } from 'prom-client';

/** What the /metrics endpoint serves: one registry, or several rendered as one. */
export interface Exposition {
  readonly contentType: string;
  metrics(): Promise<string>;
}

interface Family {
  help: string;
  type: string;
  samples: string[];
}

/**
 * Several registries as one Prometheus text exposition, for `dev`, which runs every part
 * in one process but keeps each part's registry (as in production) so every series keeps
 * its part's `part` label. Each registry renders its own text, labels included; the texts
 * are then regrouped by metric name, because a valid exposition has each family once (one
 * `# HELP`, one `# TYPE`) with all its samples under it. Not prom-client's
 * `Registry.merge`: the merged registry renders with its own default labels, so every
 * part's `part` would be lost, and it refuses a name registered twice.
 */
export function mergedExposition(registries: readonly Registry[]): Exposition {
  const first = registries[0];
  if (!first) throw new Error('mergedExposition needs at least one registry');
  if (registries.some((r) => r.contentType !== first.contentType)) throw new Error('registries of different exposition formats cannot be merged');
  return {
    contentType: first.contentType,
    async metrics() {
      const texts = await Promise.all(registries.map((r) => r.metrics()));
      return render(regroup(texts));
    },
  };
}

/**
 * prom-client writes each family as `# HELP`, `# TYPE`, its samples, then a blank line,
 * and escapes newlines in help texts and label values, so a line is always one of those.
 */
function regroup(texts: readonly string[]): Map<string, Family> {
  const families = new Map<string, Family>();
  for (const text of texts) {
    let current: Family | undefined;
    for (const line of text.split('\n')) {
      if (line === '') continue;
      const meta = /^# (HELP|TYPE) (\S+)(?: (.*))?$/.exec(line);
      if (meta) {
        const name = meta[2] as string;
        let family = families.get(name);
        if (!family) {
          family = { help: '', type: '', samples: [] };
          families.set(name, family);
        }
        if (meta[1] === 'HELP') {
          // The first registry's wording wins; parts share the metric definitions anyway.
          family.help ||= line;
        } else if (family.type === '') {
          family.type = line;
        } else if (family.type !== line) {
          throw new Error(`metric ${name} has two types (${family.type} / ${line}): one exposition cannot hold both`);
        }
        current = family;
      } else if (line.startsWith('#')) {
        continue;
      } else {
        if (!current) throw new Error(`a sample before any # HELP/# TYPE: ${line.slice(0, 80)}`);
        current.samples.push(line);
      }
    }
  }
  return families;
}

function render(families: Map<string, Family>): string {
  const out: string[] = [];
  for (const f of families.values()) {
    if (f.help) out.push(f.help);
    if (f.type) out.push(f.type);
    out.push(...f.samples, '');
  }
  return out.join('\n');
}
