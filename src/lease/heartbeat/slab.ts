/**
 * How the runner hands its leases to the heartbeat thread without a
 * message per lease: a slab of shared memory whose slots the runner fills
 * in order and publishes by bumping a counter; the thread picks up the new
 * slots on its deadline check, every few ms (thread.ts), whether or not the
 * handler's thread is running. Each slot holds the lease's cell (./cell.ts)
 * and what the extend statement needs; the owner is the slab's, sent once
 * with the slab. Slots are never reused: a full slab is replaced by a new
 * one, so a late write for an old lease can never land on a new one.
 *
 * Why not a message per lease: each one woke the idle thread, and on the
 * busy 2-core bench box that was the runner's largest cost per job, beside
 * the garbage of a buffer per cell (docs/bench-lease.md).
 */
import { CELL_BYTES, LeaseCell } from './cell.js';

/** Slots per slab (160 KiB): one message to the thread per this many leases. */
export const SLAB_SLOTS = 4096;
/** Header: the count of published slots (int32), padded to 8. */
const HEADER_BYTES = 8;
/** A slot: the cell (16), id (f64), fencing token (f64), leaseMs (i32), maxStallMs (i32). */
const SLOT_BYTES = CELL_BYTES + 8 + 8 + 4 + 4;

/** What the thread reads back from a slot. */
export interface SlabEntry {
  cell: LeaseCell;
  id: number;
  fencingToken: number;
  leaseMs: number;
  maxStallMs: number;
}

export class LeaseSlab {
  readonly buffer: SharedArrayBuffer;
  readonly #count: Int32Array;
  readonly #f64: Float64Array;
  readonly #i32: Int32Array;
  /** Writer side: the next free slot. */
  #next = 0;

  constructor(buffer: SharedArrayBuffer = new SharedArrayBuffer(HEADER_BYTES + SLAB_SLOTS * SLOT_BYTES)) {
    this.buffer = buffer;
    this.#count = new Int32Array(buffer, 0, 1);
    this.#f64 = new Float64Array(buffer, 0, buffer.byteLength >> 3);
    this.#i32 = new Int32Array(buffer, 0, buffer.byteLength >> 2);
  }

  /** Writer side: no slot left. */
  get full(): boolean {
    return this.#next === SLAB_SLOTS;
  }

  /**
   * Writer side (one writer: the runner's thread): fills the next slot and
   * publishes it. The fields are written before the count is stored with
   * `Atomics`, so a reader that loads the count sees them.
   */
  publish(lease: { id: number; fencingToken: number; leaseMs: number }, maxStallMs: number, confirmedUntil: number): LeaseCell {
    const slot = this.#next++;
    const at = HEADER_BYTES + slot * SLOT_BYTES;
    const cell = new LeaseCell(this.buffer, at);
    cell.confirmedUntil = confirmedUntil;
    this.#f64[(at + CELL_BYTES) / 8] = lease.id;
    this.#f64[(at + CELL_BYTES + 8) / 8] = lease.fencingToken;
    this.#i32[(at + CELL_BYTES + 16) / 4] = lease.leaseMs;
    this.#i32[(at + CELL_BYTES + 20) / 4] = maxStallMs;
    Atomics.store(this.#count, 0, slot + 1);
    return cell;
  }

  /** Reader side: how many slots are published. */
  published(): number {
    return Atomics.load(this.#count, 0);
  }

  /** Reader side: a published slot. */
  read(slot: number): SlabEntry {
    const at = HEADER_BYTES + slot * SLOT_BYTES;
    return {
      cell: new LeaseCell(this.buffer, at),
      id: this.#f64[(at + CELL_BYTES) / 8]!,
      fencingToken: this.#f64[(at + CELL_BYTES + 8) / 8]!,
      leaseMs: this.#i32[(at + CELL_BYTES + 16) / 4]!,
      maxStallMs: this.#i32[(at + CELL_BYTES + 20) / 4]!,
    };
  }
}
