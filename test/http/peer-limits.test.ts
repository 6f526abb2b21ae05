import { EventEmitter } from 'node:events';
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import t from 'tap';
import { AppError } from '../../src/errors.js';
import { PeerLimits, readNofileLimit, resolvePeerLimits } from '../../src/http/peer-limits.js';

const LIMITS = `Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max open files            4096                 524288               files
Max locked memory         8388608              8388608              bytes
`;

/** Stand-ins for a socket and a response: the limits only listen for their 'close'. */
const closable = <T>(): T & EventEmitter => new EventEmitter() as T & EventEmitter;

t.test('the soft open-files limit is read from /proc/self/limits', async (t) => {
  t.equal(readNofileLimit(LIMITS), 4096);
  t.equal(readNofileLimit(LIMITS.replace('4096 ', 'unlimited ')), undefined, 'unlimited: no figure');
  t.equal(readNofileLimit('nothing'), undefined);
  t.ok((readNofileLimit() ?? 0) > 0, 'this process has one');
});

t.test('defaults are shares of the limit; connections and their upstream sockets stay below it', async (t) => {
  for (const nofile of [256, 1024, 20_000, 65_536]) {
    const l = resolvePeerLimits({}, nofile);
    t.ok(l.hardConnections + l.maxConnections < nofile - 64, `${nofile}: at most ${l.hardConnections} sockets in, ${l.maxConnections} out, room left`);
    t.ok(l.connectionsPerUid * 4 <= l.maxConnections, `${nofile}: one UID takes a quarter at most`);
    t.ok(l.streamsPerUid < l.connectionsPerUid, `${nofile}: streams below connections`);
  }
  t.match(resolvePeerLimits({}, 1024), { maxConnections: 448, connectionsPerUid: 112, streamsPerUid: 56, ratePerUid: 100, burstPerUid: 200 }, 'docs/forwarder.md\'s figures');
  t.match(resolvePeerLimits({ maxConnections: 40, connectionsPerUid: 0 }, 1024), { maxConnections: 40, connectionsPerUid: 0 }, 'flags win');
});

t.test('process limit: 503 overloaded past it, dropped past the hard limit; a closed connection frees its place', async (t) => {
  const limits = new PeerLimits({ ...resolvePeerLimits({}, 1024), maxConnections: 2, hardConnections: 3 }, new Set([0]));
  const socks = [1, 2, 3, 4].map(() => closable<Socket>());
  t.same(socks.map((s) => { const g = limits.accept(s); return g instanceof AppError ? g.code : g; }), [undefined, undefined, 'overloaded', 'drop']);
  for (const s of socks.slice(1)) s.emit('close');
  t.equal(limits.open, 1);
  t.equal(limits.accept(closable<Socket>()), undefined, 'room again');
});

t.test('per UID: connections, streams and rate are each UID\'s own; exempt UIDs meet none', async (t) => {
  let now = 0;
  const limits = new PeerLimits({ ...resolvePeerLimits({}, 1024), connectionsPerUid: 2, streamsPerUid: 2, ratePerUid: 1, burstPerUid: 3 }, new Set([0]), () => now);
  const code = (g: AppError | undefined): string | undefined => g?.code;
  const conns = [1, 2, 3].map(() => closable<Socket>());
  t.same(conns.map((s) => code(limits.connected(s, 1000))), [undefined, undefined, 'too_many_connections']);
  t.equal(code(limits.connected(closable<Socket>(), 1001)), undefined, 'another UID has its own share');
  // A refused connection counts until it is closed too (it holds a descriptor until then).
  conns[2]?.emit('close');
  const again = closable<Socket>();
  t.equal(code(limits.connected(again, 1000)), 'too_many_connections', 'still two open');
  again.emit('close');
  conns[0]?.emit('close');
  t.equal(code(limits.connected(closable<Socket>(), 1000)), undefined, 'a closed one frees its place');

  const res = [1, 2, 3].map(() => closable<ServerResponse>());
  t.same(res.map((r) => code(limits.request(1000, r))), [undefined, undefined, 'too_many_streams'], 'streams');
  t.equal(code(limits.request(1001, closable<ServerResponse>())), undefined, 'another UID streams');
  res[0]?.emit('close');
  // The burst of 3 is spent (two admitted, one refused for streams): the rate refuses now.
  const refused = limits.request(1000, closable<ServerResponse>());
  t.equal(code(refused), 'rate_limited');
  t.equal(refused?.headers['retry-after'], '1');
  now += 1_000;
  t.equal(code(limits.request(1000, closable<ServerResponse>())), undefined, 'a second later, one more');
  for (let i = 0; i < 10; i++) t.equal(code(limits.request(0, closable<ServerResponse>())), undefined, 'root is exempt');
});
