import { Gauge, type Registry } from 'prom-client';

/** The one figure of the cli-proxy's audit spool read here: events recorded and not yet on disk. */
export interface AuditQueue {
  readonly queued: number;
}

/** What the cli-proxy's audit reports (with `--metrics-listen` and the audit on). */
export interface AuditMetrics {
  /** The spool whose queue the gauge reads from now on (once it is open). */
  watch(queue: AuditQueue): void;
}

/**
 * Read at the scrape, nothing per event: the spool already counts its queue for its own
 * bound (`maxQueued`), and a gauge set on every record and write would cost each call two
 * prom-client updates for a figure nobody reads between scrapes. 0 means every event
 * recorded so far is on disk (or failed, which the log says), which is what the bench
 * waits for between cells and what an operator reads as "the disk keeps up".
 */
export function createAuditMetrics(registry: Registry): AuditMetrics {
  let queue: AuditQueue | undefined;
  new Gauge({
    name: 'agent_connectors_audit_queued_events',
    help: 'Audit events of answered CLI calls waiting in memory for their write to the spool (0: every event so far is on disk).',
    registers: [registry],
    collect() {
      this.set(queue?.queued ?? 0);
    },
  });
  return {
    watch(q) {
      queue = q;
    },
  };
}
