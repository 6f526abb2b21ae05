/**
 * The slots' next-due times, soonest first: a binary min-heap with lazy deletion. Each slot
 * has at most one live entry; rescheduling or removing a slot leaves its old heap node
 * behind, skipped when it surfaces (its stamp no longer matches) and dropped by a
 * compaction once stale nodes outnumber the live ones. A wake of the renewal then costs
 * O(changed · log N) plus the due slots, not a walk over every slot.
 */
interface Node {
  due: number;
  /** Ties (every new slot is due at 0) in the order they were scheduled. */
  seq: number;
  slot: string;
}

export class DueQueue {
  readonly #heap: Node[] = [];
  /** slot → the seq of its live node. */
  readonly #live = new Map<string, number>();
  #seq = 0;

  get size(): number {
    return this.#live.size;
  }

  has(slot: string): boolean {
    return this.#live.has(slot);
  }

  /** Sets (or moves) the slot's next-due time. */
  schedule(slot: string, due: number): void {
    const seq = ++this.#seq;
    this.#live.set(slot, seq);
    this.#push({ due, seq, slot });
    if (this.#heap.length > 64 && this.#heap.length > 2 * this.#live.size) this.#compact();
  }

  /** The slot is no longer scheduled (not due, or gone). */
  remove(slot: string): void {
    this.#live.delete(slot);
  }

  clear(): void {
    this.#live.clear();
    this.#heap.length = 0;
  }

  /** The soonest due time, or undefined when nothing is scheduled. */
  peekDue(): number | undefined {
    this.#dropStale();
    return this.#heap[0]?.due;
  }

  /** Takes the soonest slot if it is due at `now` (it is then unscheduled); else undefined. */
  popDue(now: number): string | undefined {
    this.#dropStale();
    const top = this.#heap[0];
    if (top === undefined || top.due > now) return undefined;
    this.#pop();
    this.#live.delete(top.slot);
    return top.slot;
  }

  #stale(n: Node): boolean {
    return this.#live.get(n.slot) !== n.seq;
  }

  #dropStale(): void {
    while (this.#heap.length > 0 && this.#stale(this.#heap[0] as Node)) this.#pop();
  }

  #compact(): void {
    const live = this.#heap.filter((n) => !this.#stale(n));
    this.#heap.length = 0;
    for (const n of live) this.#heap.push(n);
    // Heapify bottom-up: O(n).
    for (let i = (this.#heap.length >> 1) - 1; i >= 0; i--) this.#down(i);
  }

  #less(a: Node, b: Node): boolean {
    return a.due < b.due || (a.due === b.due && a.seq < b.seq);
  }

  #push(n: Node): void {
    const h = this.#heap;
    h.push(n);
    let i = h.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.#less(h[i] as Node, h[p] as Node)) break;
      [h[i], h[p]] = [h[p] as Node, h[i] as Node];
      i = p;
    }
  }

  #pop(): void {
    const h = this.#heap;
    const last = h.pop();
    if (last === undefined || h.length === 0) return;
    h[0] = last;
    this.#down(0);
  }

  #down(i: number): void {
    const h = this.#heap;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let m = i;
      if (l < h.length && this.#less(h[l] as Node, h[m] as Node)) m = l;
      if (r < h.length && this.#less(h[r] as Node, h[m] as Node)) m = r;
      if (m === i) return;
      [h[i], h[m]] = [h[m] as Node, h[i] as Node];
      i = m;
    }
  }
}
