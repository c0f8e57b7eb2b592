/**
 * The metrics backend with no dependency: Prometheus text exposition
 * (format 0.0.4), written by hand, the same on Node and Workers. Workers use
 * it; the Node entry uses prom-client instead (./metrics-node.ts).
 */
import type { MetricSpec } from './metrics-spec.js';

/** One metric, its series addressed by label values in the spec's label order. */
export interface Series {
  inc(values: readonly string[], by?: number): void;
  set(values: readonly string[], value: number): void;
  observe(values: readonly string[], value: number): void;
  /** Drops every series (a gauge that has nothing to say this scrape). */
  reset(): void;
}

/** Where metrics are kept and rendered from. */
export interface MetricBackend {
  /** Registers `spec` (once per name) and returns its series. */
  metric(spec: MetricSpec): Series;
  render(): string | Promise<string>;
  /** The Content-Type of `render()`. */
  readonly contentType: string;
}

interface Entry {
  spec: MetricSpec;
  values: Map<string, { labels: readonly string[]; value: number; counts?: number[]; sum?: number }>;
}

/**
 * @example
 * const backend = createTextBackend();
 * backend.metric(SPECS.inflight).set([], 3);
 * backend.render(); // "# HELP fencegate_inflight_requests …\nfencegate_inflight_requests 3\n"
 */
export function createTextBackend(): MetricBackend {
  const entries = new Map<string, Entry>();
  return {
    contentType: 'text/plain; version=0.0.4; charset=utf-8',
    metric(spec) {
      let e = entries.get(spec.name);
      if (e === undefined) entries.set(spec.name, (e = { spec, values: new Map() }));
      const entry = e;
      const at = (labels: readonly string[]) => {
        const k = labels.join('\u0000');
        let v = entry.values.get(k);
        if (v === undefined) {
          v = { labels: [...labels], value: 0 };
          if (spec.type === 'histogram') Object.assign(v, { counts: new Array(spec.buckets!.length).fill(0), sum: 0 });
          entry.values.set(k, v);
        }
        return v;
      };
      // An unlabelled histogram is one series from the start, as prom-client
      // shows it (its count at 0 before the first observation).
      if (spec.type === 'histogram' && spec.labels.length === 0) at([]);
      return {
        inc: (labels, by = 1) => void (at(labels).value += by),
        set: (labels, value) => void (at(labels).value = value),
        observe(labels, value) {
          const v = at(labels);
          v.value++;
          v.sum! += value;
          const b = spec.buckets!;
          for (let i = 0; i < b.length; i++) if (value <= b[i]!) v.counts![i]!++;
        },
        reset: () => entry.values.clear(),
      };
    },
    render() {
      const out: string[] = [];
      for (const { spec, values } of entries.values()) {
        out.push(`# HELP ${spec.name} ${spec.help}`, `# TYPE ${spec.name} ${spec.type}`);
        const sorted = [...values.values()].sort((a, b) => (a.labels.join('\u0000') < b.labels.join('\u0000') ? -1 : 1));
        for (const v of sorted) {
          const pairs = spec.labels.map((l, i) => `${l}="${esc(v.labels[i]!)}"`);
          if (spec.type !== 'histogram') {
            out.push(`${spec.name}${braces(pairs)} ${v.value}`);
            continue;
          }
          spec.buckets!.forEach((le, i) => out.push(`${spec.name}_bucket${braces([...pairs, `le="${le}"`])} ${v.counts![i]}`));
          out.push(
            `${spec.name}_bucket${braces([...pairs, 'le="+Inf"'])} ${v.value}`,
            `${spec.name}_sum${braces(pairs)} ${v.sum}`,
            `${spec.name}_count${braces(pairs)} ${v.value}`,
          );
        }
      }
      return out.join('\n') + '\n';
    },
  };
}

function braces(pairs: string[]): string {
  return pairs.length === 0 ? '' : `{${pairs.join(',')}}`;
}

function esc(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}
