/**
 * The runner's typed events (DESIGN §6). They carry ids, tokens, lease ends,
 * request ids and hashes, never payloads, results or bodies (CONTRIBUTING.md convention 10).
 */

interface JobFields {
  /** Local wall-clock time of the event, for logs only (never for expiry, G6). */
  at: Date;
  workerId: string;
  jobId: number;
  kind: string;
  fencingToken: number;
}

/** An external action (`fencedFetch` or `step`) that has started and not yet settled. */
export interface InFlightRequest {
  step: string;
  /** The `Idempotency-Key` it was sent with: what to look up at the gateway or the provider. */
  idempotencyKey: string;
  /** The `X-Request-Id` it was sent with (the gateway logs it). */
  requestId: string;
  /** Local wall-clock time it started, for logs only. */
  startedAt: Date;
}

export interface LeaseEventMap {
  job_claimed: JobFields & {
    attempt: number;
    leaseUntil: Date;
    payloadSha256: string;
    /** The owner whose lease had expired, when this claim took the job over. */
    previousOwnerId: string | null;
  };
  heartbeat_ok: JobFields & { leaseUntil: Date; latencyMs: number };
  heartbeat_failed: JobFields & { error: string; consecutive: number };
  /**
   * The lease is gone: `zero_rows` (an extend matched nothing), `unconfirmed`
   * (no heartbeat succeeded before the conservative deadline), `stalled` (the
   * handler's thread stopped ticking, so heartbeats stopped), `stale_fence`
   * (the gateway refused our fence) or `thread_exit` (the heartbeat thread died).
   */
  heartbeat_lost: JobFields & { cause: 'zero_rows' | 'unconfirmed' | 'stalled' | 'stale_fence' | 'thread_exit' };
  /**
   * The lease cannot be confirmed for another heartbeat interval: no new
   * external action may start. What an on-call engineer needs to judge it:
   * until when the database last confirmed the lease (after that, another
   * worker may hold the job), and which external requests were in flight
   * (their idempotency keys and request ids), so each can be looked up at
   * the gateway or the provider.
   */
  ownership_unknown: JobFields & {
    confirmedForMs: number;
    consecutiveFailures: number;
    /** The lease end (database time) as of the last successful extend, or of the claim. */
    lastConfirmedLeaseUntil: Date;
    /** The attempt's external actions in flight when ownership became unknown; empty if none. */
    inFlight: InFlightRequest[];
  };
  tool_request_started: JobFields & {
    step: string;
    idempotencyKey: string;
    requestId: string;
    /** For `fencedFetch`; absent for a `step(...)` that is not HTTP. */
    method?: string;
    /** Origin and path only: a query string may carry secrets. */
    url?: string;
  };
  /**
   * A `fencedFetch` answer carried `fencegate-reconciled: true`: the gateway
   * learned from the upstream's status endpoint that an earlier attempt of
   * this step was performed, and replayed that answer (DESIGN §3.12). The
   * step's effect happened once, in an attempt whose answer was lost.
   */
  outcome_reconciled: JobFields & {
    step: string;
    idempotencyKey: string;
    requestId: string;
    /** How many outcome-unknown answers with the gateway's hint `fencedFetch` (409) or `fencedMcp` (-32005) waited out first (0: reconciled on the first send). */
    waits: number;
  };
  result_committed: JobFields & { resultSha256: string };
  /** The result (or failure) was not stored: the lease was lost, the attempt timed out, or the store failed. */
  result_rejected: JobFields & { reason: 'lease_lost' | 'stage_timeout' | 'store_error'; error?: string };
  /** An attempt failed: requeued with a backoff, or the job is terminally failed. */
  job_failed: JobFields & {
    reason: string;
    terminal: boolean;
    errorCode: string;
    retryAt?: Date;
  };
}

export type LeaseEventType = keyof LeaseEventMap;
export type LeaseEvent = { [K in LeaseEventType]: { type: K } & LeaseEventMap[K] }[LeaseEventType];
export type LeaseEventOf<K extends LeaseEventType> = Extract<LeaseEvent, { type: K }>;

type Listener = (event: LeaseEvent) => void;

/**
 * A small typed emitter. A listener that throws cannot break the worker: its
 * error is dropped (log inside your listener if you need to).
 *
 * @example
 * worker.events.on('heartbeat_lost', (e) => log.warn({ job: e.jobId, token: e.fencingToken, cause: e.cause }));
 * const claimed = await worker.events.waitFor('job_claimed', (e) => e.jobId === 7);
 */
export class LeaseEvents {
  readonly #listeners = new Map<LeaseEventType | '*', Set<Listener>>();

  /** Subscribes to one event type; returns the unsubscribe function. */
  on<K extends LeaseEventType>(type: K, listener: (event: LeaseEventOf<K>) => void): () => void {
    return this.#add(type, listener as Listener);
  }

  /** Subscribes to every event; returns the unsubscribe function. */
  onAny(listener: (event: LeaseEvent) => void): () => void {
    return this.#add('*', listener);
  }

  /** The next event of `type` that satisfies `predicate`; rejects on `signal` abort. */
  waitFor<K extends LeaseEventType>(type: K, predicate: (event: LeaseEventOf<K>) => boolean = () => true, signal?: AbortSignal): Promise<LeaseEventOf<K>> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const onAbort = () => {
        off();
        reject(signal?.reason);
      };
      const off = this.on(type, (event) => {
        if (!predicate(event)) return;
        off();
        signal?.removeEventListener('abort', onAbort);
        resolve(event);
      });
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  emit(event: LeaseEvent): void {
    for (const key of [event.type, '*'] as const) {
      for (const listener of this.#listeners.get(key) ?? []) {
        try {
          listener(event);
        } catch {
          // A listener's fault must not change what the worker does.
        }
      }
    }
  }

  #add(key: LeaseEventType | '*', listener: Listener): () => void {
    let set = this.#listeners.get(key);
    if (!set) this.#listeners.set(key, (set = new Set()));
    set.add(listener);
    return () => set.delete(listener);
  }
}
