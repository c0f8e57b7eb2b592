/**
 * The PostgreSQL store's client-side bound of one round trip
 * (`queryTimeoutMs`, `store.queryTimeout`) when it opens its own pool. Here,
 * outside ./postgres/, so that the config schema, which every bundle holds
 * (the Workers one too), can name the default without pulling in a file of
 * the PostgreSQL store.
 */
export const DEFAULT_QUERY_TIMEOUT_MS = 15_000;
