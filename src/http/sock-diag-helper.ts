import { spawn, type ChildProcess } from 'node:child_process';
import { isIPv4 } from 'node:net';
import { createInterface } from 'node:readline';

/**
 * One long-lived `perl` process that asks the kernel for exactly one socket over netlink
 * sock_diag (SOCK_DIAG_BY_FAMILY without NLM_F_DUMP: a hash lookup of the 4-tuple, the
 * same whatever the host's socket count). Node cannot open AF_NETLINK; perl can, and
 * perl-base is Essential on Debian, so it is on every host the package installs on.
 *
 * Protocol, one line each way, answers in order: `<family 4|6> <src> <sport> <dst> <dport>`
 * → `<uid> <state>` of the socket whose local end is src:sport and remote end dst:dport
 * (state as the kernel numbers it, 1 = ESTABLISHED), or `-` when there is none.
 */
const SCRIPT = String.raw`
use strict; use warnings; use Socket qw(inet_pton AF_INET AF_INET6);
$| = 1;
socket(my $nl, 16, 3 | 0x80000, 4) or die "netlink: $!\n";
my $seq = 0;
while (my $line = <STDIN>) {
  my ($fam, $src, $sport, $dst, $dport) = split ' ', $line;
  my $af = $fam eq '6' ? AF_INET6 : AF_INET;
  my $s = inet_pton($af, $src // ''); my $d = inet_pton($af, $dst // '');
  unless (defined $s && defined $d && defined $dport) { print "-\n"; next; }
  $seq++;
  my $req = pack('CCCCL', $af, 6, 0, 0, 0xffffffff) . pack('nna16a16LLL', $sport, $dport, $s, $d, 0, 0xffffffff, 0xffffffff);
  send($nl, pack('LSSLL', 16 + length($req), 20, 1, $seq, 0) . $req, 0) or die "send: $!\n";
  my $answer = '-';
  while (1) {
    defined(recv($nl, my $buf, 65536, 0)) or die "recv: $!\n";
    my ($len, $type, $flags, $rseq) = unpack('LSSL', $buf);
    next unless defined $rseq && $rseq == $seq;
    $answer = unpack('L', substr($buf, 80, 4)) . ' ' . unpack('C', substr($buf, 17, 1)) if $type == 20 && length($buf) >= 84;
    last;
  }
  print "$answer\n";
}
`;

/** The kernel's TCP_ESTABLISHED. */
const ESTABLISHED = 1;

type Waiter = (answer: { uid: number; state: number } | undefined) => void;

/**
 * Questions the helper may owe at once. A helper that stops answering (stopped, starved of
 * CPU) would otherwise queue one question and one pending connection per connect a local
 * user makes, without limit. 1024 is far above what a healthy helper ever owes (it answers
 * in well under a millisecond of CPU) and small enough that the queue's memory is trivial.
 */
export const MAX_OUTSTANDING = 1024;

/** An overload episode: its start (a question refused at the cap) and its end (drained). */
export type OverloadEvent = { kind: 'saturated'; outstanding: number } | { kind: 'recovered'; refused: number };

export interface SockDiagHelperOptions {
  perl?: string;
  maxOutstanding?: number;
  /** Called once when an episode starts and once when it ends, never per refused question. */
  onOverload?: (event: OverloadEvent) => void;
}

/** The v4 form of a v4 or v4-mapped address: a v4 lookup also finds a dual-stack socket using mapped addresses. */
function v4Of(address: string): string | undefined {
  return isIPv4(address) ? address : /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)?.[1];
}

export class SockDiagHelper {
  private child: ChildProcess | undefined;
  private readonly waiting: Waiter[] = [];
  private readonly perl: string;
  private readonly max: number;
  private readonly onOverload: ((event: OverloadEvent) => void) | undefined;
  /** Questions refused in the current overload episode; undefined when not in one. */
  private refused: number | undefined;

  constructor(opts: SockDiagHelperOptions = {}) {
    this.perl = opts.perl ?? 'perl';
    this.max = opts.maxOutstanding ?? MAX_OUTSTANDING;
    this.onOverload = opts.onOverload;
  }

  /** Questions asked and not yet answered. */
  get outstanding(): number {
    return this.waiting.length;
  }

  private start(): ChildProcess {
    // An empty environment: nothing of ours (no PERL5OPT, no PERL5LIB) shapes what it runs.
    const child = spawn(this.perl, ['-e', SCRIPT], { env: {}, stdio: ['pipe', 'pipe', 'ignore'] });
    child.stdin!.on('error', () => undefined);
    createInterface({ input: child.stdout! }).on('line', (line) => {
      const m = /^(\d+) (\d+)$/.exec(line);
      this.waiting.shift()?.(m ? { uid: Number(m[1]), state: Number(m[2]) } : undefined);
      this.drained();
    });
    const fail = (): void => {
      if (this.child === child) this.child = undefined;
      // Whatever was asked of a dead helper is refused; the next question starts a new one.
      for (const w of this.waiting.splice(0)) w(undefined);
      this.drained();
    };
    child.once('error', fail);
    child.once('exit', fail);
    return child;
  }

  /**
   * The owner of the socket at the other end of one of ours: its local end is our remote
   * end. For a connection we accepted that is the client's socket; for one we made, the
   * socket the listener's side holds for it, owned by the listener's owner.
   *
   * `established`: only a socket in ESTABLISHED counts. The kernel reports a half-open
   * server side (a request socket, left so when the listener's accept queue is full) as
   * SYN_RECV with uid 0, which would pass for root.
   */
  lookup(remoteAddress: string, remotePort: number, localAddress: string, localPort: number, established = false): Promise<number | undefined> {
    const r4 = v4Of(remoteAddress);
    const l4 = v4Of(localAddress);
    const q = r4 && l4 ? `4 ${r4} ${remotePort} ${l4} ${localPort}` : `6 ${remoteAddress} ${remotePort} ${localAddress} ${localPort}`;
    if (/[^0-9a-fA-F.: ]/.test(q)) return Promise.resolve(undefined);
    if (this.waiting.length >= this.max) {
      // Fail closed: no answer is no UID, which refuses the connection (403 forbidden_peer).
      if (this.refused === undefined) {
        this.refused = 0;
        this.onOverload?.({ kind: 'saturated', outstanding: this.waiting.length });
      }
      this.refused += 1;
      return Promise.resolve(undefined);
    }
    this.child ??= this.start();
    const stdin = this.child.stdin!;
    // A burst of connections (256 SSE streams opened at once, each with an upstream
    // connection to check too) asks dozens of questions in one turn: one pipe write for
    // them all instead of a write(2) each, which wakes the helper every time.
    if (!stdin.writableCorked) {
      stdin.cork();
      process.nextTick(() => stdin.uncork());
    }
    return new Promise((resolve) => {
      this.waiting.push((answer) => resolve(answer && (!established || answer.state === ESTABLISHED) ? answer.uid : undefined));
      stdin.write(`${q}\n`);
    });
  }

  /** An episode ends once the helper has worked off half its queue: no flapping at the cap. */
  private drained(): void {
    if (this.refused === undefined || this.waiting.length > this.max / 2) return;
    const refused = this.refused;
    this.refused = undefined;
    this.onOverload?.({ kind: 'recovered', refused });
  }

  /** The helper's pid once started (the bench reads its CPU). */
  get pid(): number | undefined {
    return this.child?.pid;
  }

  close(): void {
    this.child?.kill('SIGKILL');
    this.child = undefined;
  }
}
