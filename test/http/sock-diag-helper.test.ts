import { once } from 'node:events';
import { connect, createServer, type AddressInfo, type Socket } from 'node:net';
import t from 'tap';
import { SockDiagHelper, type OverloadEvent } from '../../src/http/sock-diag-helper.js';
import type { TapTest } from '../support/tap.js';

/*
 * The helper's queue is bounded: a helper that stops answering (here: really stopped, with
 * SIGSTOP to the perl process this test started) must not collect one question and one
 * pending connection per connect without limit. Beyond the cap a question is refused at
 * once (no UID: the connection is refused), and the episode is reported once.
 */

type Tuple = [string, number, string, number];

async function loopback(): Promise<() => Promise<Tuple>> {
  const server = createServer((s) => s.on('error', () => undefined));
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const accepted: Socket[] = [];
  const clients: Socket[] = [];
  t.teardown(() => {
    for (const s of [...accepted, ...clients]) s.destroy();
    server.close();
  });
  return async () => {
    const got = once(server, 'connection') as Promise<[Socket]>;
    const c = connect((server.address() as AddressInfo).port, '127.0.0.1');
    c.on('error', () => undefined);
    clients.push(c);
    const [s] = await got;
    accepted.push(s);
    return [s.remoteAddress ?? '', s.remotePort ?? 0, s.localAddress ?? '', s.localPort ?? 0];
  };
}

/** A helper with the given cap that has answered once (so its process runs), and a loopback to ask about. */
async function runningHelper(t: TapTest, cap: number): Promise<{ events: OverloadEvent[]; helper: SockDiagHelper; accept: () => Promise<Tuple>; own: number | undefined; pid: number }> {
  const events: OverloadEvent[] = [];
  const helper = new SockDiagHelper({ maxOutstanding: cap, onOverload: (e) => events.push(e) });
  t.teardown(() => helper.close());
  const accept = await loopback();
  const own = process.getuid?.();
  t.equal(await helper.lookup(...(await accept())), own, 'the helper answers');
  const pid = helper.pid;
  if (pid === undefined) throw new Error('no helper pid');
  return { events, helper, accept, own, pid };
}

t.test('a stopped helper: questions past the cap are refused at once, one episode reported; the held ones are answered once it runs again', async (t) => {
  const CAP = 16;
  const { events, helper, accept, own, pid } = await runningHelper(t, CAP);
  process.kill(pid, 'SIGSTOP');
  t.teardown(() => {
    try {
      process.kill(pid, 'SIGCONT');
    } catch {
      // already gone
    }
  });

  // A flood: three times the cap, each a real connection.
  const tuples: Tuple[] = [];
  for (let i = 0; i < 3 * CAP; i++) tuples.push(await accept());
  const answers = tuples.map((tp) => helper.lookup(...tp));
  // These resolve while the helper cannot run: only the cap can have answered them.
  t.same(await Promise.all(answers.slice(CAP)), new Array(2 * CAP).fill(undefined), 'every question past the cap: no UID (refused)');
  t.equal(helper.outstanding, CAP, 'the queue holds exactly the cap');
  t.same(events, [{ kind: 'saturated', outstanding: CAP }], 'the episode is reported once, not per refused question');

  process.kill(pid, 'SIGCONT');
  t.same(await Promise.all(answers.slice(0, CAP)), new Array(CAP).fill(own), 'the queued questions get their real answers');
  t.same(events.at(-1), { kind: 'recovered', refused: 2 * CAP }, 'the end of the episode, with the count refused');
  t.equal(events.length, 2);
  t.equal(await helper.lookup(...(await accept())), own, 'questions are answered again');
});

t.test('a helper killed while questions are queued: they are refused, the episode ends, the next question starts a new helper', async (t) => {
  const CAP = 4;
  const { events, helper, accept, own, pid } = await runningHelper(t, CAP);
  process.kill(pid, 'SIGSTOP');
  const tuples: Tuple[] = [];
  for (let i = 0; i < CAP + 2; i++) tuples.push(await accept());
  const answers = tuples.map((tp) => helper.lookup(...tp));
  await Promise.all(answers.slice(CAP));
  process.kill(pid, 'SIGKILL');
  t.same(await Promise.all(answers), new Array(CAP + 2).fill(undefined), 'nothing a dead helper owed is allowed');
  t.same(events, [
    { kind: 'saturated', outstanding: CAP },
    { kind: 'recovered', refused: 2 },
  ]);
  t.equal(await helper.lookup(...(await accept())), own, 'a new helper answers');
  t.not(helper.pid, pid);
});

t.test('questions asked in one turn (one pipe write) are each answered, in order: live sockets and gone ones interleaved', async (t) => {
  const { helper, accept, own } = await runningHelper(t, 1024);
  const live: Tuple[] = [];
  for (let i = 0; i < 40; i++) live.push(await accept());
  // A port nothing listens on: no such socket, whatever the helper batches it with.
  const gone = (tp: Tuple): Tuple => [tp[0], tp[1], tp[2], 1];
  const asked = live.flatMap((tp) => [tp, gone(tp)]);
  const answers = await Promise.all(asked.map((tp) => helper.lookup(...tp)));
  t.same(answers, live.flatMap(() => [own, undefined]), 'every answer belongs to its own question');
  t.equal(helper.outstanding, 0, 'nothing left owed');
  t.equal(await helper.lookup(...(await accept())), own, 'and the next turn is answered too');
});
