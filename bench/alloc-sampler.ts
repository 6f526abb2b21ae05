/**
 * Preloaded into a bench peer (`node --import …/alloc-sampler.js`) by `--mcp --mcp-alloc`:
 * V8's sampling heap profiler for the life of the process, objects the scavenger and the
 * mark-compactor collected included, so the profile is what was allocated, not what
 * survived. Written at exit to `$BENCH_ALLOC_DIR/alloc-<pid>.heapprofile` (an in-process
 * inspector session answers synchronously, so the 'exit' handler can stop and write it).
 * SIGUSR2 restarts the sampling: the bench sends it after its warm-up.
 * With BENCH_ALLOC_SURVIVORS=1, objects the scavenger collected are left out: the profile
 * is then what outlived the young generation (promoted, or alive at exit), which is what
 * the mark-compactor pays for.
 */
import { writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { join } from 'node:path';

const dir = process.env.BENCH_ALLOC_DIR;
if (dir) {
  const session = new Session();
  session.connect();
  const interval = Number(process.env.BENCH_ALLOC_INTERVAL ?? 4096);
  const survivorsOnly = process.env.BENCH_ALLOC_SURVIVORS === '1';
  const start = (): void =>
    session.post('HeapProfiler.startSampling', {
      samplingInterval: interval,
      includeObjectsCollectedByMajorGC: true,
      includeObjectsCollectedByMinorGC: !survivorsOnly,
    });
  start();
  // The bench's mark after its warm-up: what was sampled so far (start-up, the first
  // calls' compilation) is dropped, so the profile holds the measured calls only.
  process.on('SIGUSR2', () => {
    session.post('HeapProfiler.stopSampling', () => start());
  });
  process.once('exit', () => {
    session.post('HeapProfiler.stopSampling', (err, res) => {
      if (!err) writeFileSync(join(dir, `alloc-${process.pid}.heapprofile`), JSON.stringify(res.profile));
    });
  });
}
