import { pino } from 'pino';
import t from 'tap';
import { accessLogFor, isoNow } from '../../src/log/access-line.js';
import { ACCESS_FLUSH_CHARS, ACCESS_FLUSH_MS, LogSink } from '../../src/log/sink.js';

/** A destination that records every write(2)-to-be, as written. */
class Recorder {
  readonly writes: string[] = [];
  write(data: string): boolean {
    this.writes.push(data);
    return true;
  }
  lines(): Array<Record<string, unknown>> {
    return this.writes
      .join('')
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  }
}

function setup(level: pino.LevelWithSilent = 'info'): { rec: Recorder; sink: LogSink; log: pino.Logger } {
  const rec = new Recorder();
  const sink = new LogSink(rec);
  // The product's logger options (src/log/logger.ts), writing to this sink.
  const log = pino(
    {
      name: 'agent-connectors',
      level,
      base: { pid: process.pid },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
      redact: { paths: ['token', 'authorization', 'credential'], censor: '[redacted]' },
    },
    sink,
  );
  return { rec, sink, log };
}

const fields = {
  reqId: '8d7f187a-7a4e-484a-981e-80a2003cfef2',
  method: 'POST',
  bytesIn: 995,
  bytesOut: 0,
  outcome: 'ok',
  binding: 'benc…',
  retried: false,
  durationMs: 1.234,
  upstreamStatus: undefined,
};

t.test('the access line is the line pino would write (bar the time)', async (t) => {
  const { rec, sink, log } = setup();
  const child = log.child({ part: 'forwarder' });
  accessLogFor(child)(fields);
  sink.flush();
  child.info(fields, 'access');
  const [ours, pinos] = rec.lines();
  t.ok(ours && pinos, 'two lines');
  t.match(ours?.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, 'ISO time');
  t.strictSame({ ...ours, time: 'T' }, { ...pinos, time: 'T' }, 'same fields and values, bindings included');
  t.notOk('upstreamStatus' in (ours ?? {}), 'undefined fields are left out');
});

t.test('strings JSON must escape are escaped; secrets under redacted keys are censored', async (t) => {
  const { rec, sink, log } = setup();
  const nasty = 'a"b\\c\nd\u0001e\u2028f\ud800';
  accessLogFor(log)({ reqId: nasty, token: 'SECRET-TOKEN', authorization: 'Bearer SECRET-TOKEN', credential: 'SECRET-TOKEN', 'odd"key': 1 });
  sink.flush();
  t.notMatch(rec.writes.join(''), /SECRET-TOKEN/, 'no secret written');
  const [line] = rec.lines();
  t.equal(line?.reqId, JSON.parse(JSON.stringify(nasty)) as string, 'value round-trips');
  t.equal(line?.token, '[redacted]');
  t.equal(line?.authorization, '[redacted]');
  t.equal(line?.credential, '[redacted]');
  t.equal(line?.['odd"key'], 1, 'a key needing escapes is escaped too');
  t.equal(rec.writes.join('').split('\n').length, 2, 'one line, newline-terminated');
});

t.test('non-finite numbers are written as null, as JSON.stringify does', async (t) => {
  const { rec, sink, log } = setup();
  accessLogFor(log)({ durationMs: Number.NaN, bytesIn: Number.POSITIVE_INFINITY });
  sink.flush();
  const [line] = rec.lines();
  t.equal(line?.durationMs, null);
  t.equal(line?.bytesIn, null);
});

t.test('below info nothing is written', async (t) => {
  const { rec, sink, log } = setup('warn');
  accessLogFor(log)(fields);
  sink.flush();
  t.equal(rec.writes.length, 0);
});

t.test('access lines are batched and never overtaken by an ordinary line', async (t) => {
  const { rec, log } = setup();
  const access = accessLogFor(log);
  access({ reqId: 'r1' });
  access({ reqId: 'r2' });
  t.equal(rec.writes.length, 0, 'nothing written synchronously');
  log.warn('ordinary');
  t.equal(rec.writes.length, 2, 'the pending access lines went out first, then the ordinary line');
  t.strictSame(
    rec.lines().map((l) => l.reqId ?? l.msg),
    ['r1', 'r2', 'ordinary'],
  );
  access({ reqId: 'r3' });
  access({ reqId: 'r4' });
  await new Promise((r) => setTimeout(r, ACCESS_FLUSH_MS * 3));
  t.equal(rec.writes.length, 3, 'one write for both lines of that window');
  t.match(rec.writes[2], /"reqId":"r3"[\s\S]*"reqId":"r4"/);
});

t.test('a full buffer is written at once, without waiting for the timer', async (t) => {
  const { rec, log } = setup();
  const access = accessLogFor(log);
  const big = 'x'.repeat(1000);
  let n = 0;
  while (rec.writes.length === 0 && n < 1000) access({ reqId: `r${n++}`, pad: big });
  t.equal(rec.writes.length, 1, 'written synchronously once the buffer filled');
  t.ok(rec.writes[0] && rec.writes[0].length >= ACCESS_FLUSH_CHARS, 'at the threshold');
  t.equal(rec.lines().length, n, 'every line of the burst, whole');
});

t.test('a logger that does not write to a LogSink gets the plain pino call', async (t) => {
  const rec = new Recorder();
  const log = pino({ base: null, timestamp: false }, rec);
  accessLogFor(log)({ reqId: 'plain' });
  t.equal(rec.writes.length, 1, 'written at once by pino');
  t.strictSame(rec.lines()[0], { level: 30, reqId: 'plain', msg: 'access' });
});

t.test('the line\'s time is Date#toISOString\'s, across milliseconds, seconds, days and years', async (t) => {
  let seed = 7;
  const rand = (n: number): number => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed % n;
  };
  const starts = [Date.now(), Date.UTC(2026, 11, 31, 23, 59, 59, 990), Date.UTC(2028, 1, 28, 23, 59, 58, 500), 0, 999];
  let bad = 0;
  for (const start of starts) {
    let now = start;
    for (let k = 0; k < 5000; k++) {
      // Mostly the next few milliseconds, sometimes a jump (and back: the clock can be set).
      now = rand(50) === 0 ? Math.max(0, now + rand(200_000_000) - 100_000_000) : now + rand(4);
      if (isoNow(now) !== new Date(now).toISOString()) bad++;
    }
  }
  t.equal(bad, 0);
});


t.test('the window timer is re-armed for each window, also after a write took its lines early', async (t) => {
  const { rec, log } = setup();
  const access = accessLogFor(log);
  // The sink's timer is unref'd (never what keeps a process alive): this keeps the test's.
  const alive = setInterval(() => undefined, 1000);
  t.teardown(() => clearInterval(alive));
  const written = (): Promise<void> =>
    new Promise((resolve) => {
      const write = rec.write.bind(rec);
      rec.write = (data: string): boolean => {
        rec.write = write;
        const ok = write(data);
        resolve();
        return ok;
      };
    });
  for (const id of ['r1', 'r2', 'r3']) {
    const next = written();
    access({ reqId: id });
    t.equal(rec.writes.length, ['r1', 'r2', 'r3'].indexOf(id), `${id} not written synchronously`);
    await next;
  }
  t.strictSame(
    rec.lines().map((l) => l.reqId),
    ['r1', 'r2', 'r3'],
    'each window written by its timer',
  );
  // An ordinary line takes the pending ones while the timer is still armed; the timer then
  // fires on nothing, and the next window's line still goes out on its own.
  access({ reqId: 'r4' });
  log.warn('ordinary');
  const next = written();
  access({ reqId: 'r5' });
  await next;
  t.strictSame(
    rec.lines().map((l) => l.reqId ?? l.msg),
    ['r1', 'r2', 'r3', 'r4', 'ordinary', 'r5'],
  );
});

t.test('numbers are written as JSON.stringify writes them, durations rounded to the microsecond included', async (t) => {
  const { rec, sink, log } = setup();
  const access = accessLogFor(log);
  let seed = 11;
  const rand = (): number => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed / 2 ** 31;
  };
  const values: number[] = [0, -0, 1, 0.001, 0.01, 0.1, 0.5, 0.999, 1.5, 2.25, 10.1, 999.999, 1e9 - 0.001, 1e9 + 0.5, 123456.789, -1.5, 1e21, 1.7976931348623157e308, 5e-324, 0.1 + 0.2];
  for (let k = 0; k < 3000; k++) {
    const ms = rand() * 10 ** Math.floor(rand() * 9);
    values.push(Math.round(ms * 1000) / 1000, ms);
  }
  for (const v of values) access({ durationMs: v });
  sink.flush();
  const text = rec.writes.join('');
  const expected = values.map((v) => `"durationMs":${JSON.stringify(v)},"msg"`);
  const got = text.split('\n').filter(Boolean).map((l) => /"durationMs":[^,]*,"msg"/.exec(l)?.[0]);
  t.equal(got.length, values.length);
  t.equal(got.filter((g, i) => g !== expected[i]).length, 0, 'every number as JSON.stringify writes it');
});

t.test('a line written in pieces is whole in the write, beside other lines and ordinary ones', async (t) => {
  const { rec, sink, log } = setup();
  const access = accessLogFor(log.child({ part: 'forwarder' }));
  access({ ...fields, reqId: 'a' });
  sink.writeBatched('{"msg":"raw"}\n');
  access({ ...fields, reqId: 'b', token: 'SECRET' });
  log.info('ordinary');
  t.equal(rec.writes.length, 2, 'the batch, then the ordinary line');
  t.strictSame(
    rec.lines().map((l) => l.reqId ?? l.msg),
    ['a', 'raw', 'b', 'ordinary'],
  );
  t.notMatch(rec.writes.join(''), /SECRET/);
});
