/**
 * Runs `fn` over `items` with at most `limit` calls in flight, each item exactly once, in
 * order of start. `fn` answering 'stop' (or throwing) starts no further item; the calls
 * already in flight finish first, so nothing is left running behind the caller's back.
 * The first error is rethrown once every call has settled.
 */
export async function eachBounded<T>(items: Iterable<T>, limit: number, fn: (item: T) => Promise<'stop' | undefined>): Promise<void> {
  const next = items[Symbol.iterator]();
  let stopped = false;
  let failure: { err: unknown } | undefined;
  const worker = async (): Promise<void> => {
    while (!stopped) {
      const item = next.next();
      if (item.done === true) return;
      try {
        if ((await fn(item.value)) === 'stop') stopped = true;
      } catch (err) {
        stopped = true;
        failure ??= { err };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.floor(limit)) }, worker));
  if (failure) throw failure.err;
}
