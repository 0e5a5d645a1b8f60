/**
 * Fast decoding of a GGUF string array (`u64 length` + UTF-8 bytes, repeated) that lies wholly in a buffer.
 *
 * Calling `TextDecoder.decode` once per token costs far more than the bytes (an op call per string, and
 * vocabularies hold 150k-250k tokens each plus as many merges). Instead, one pass validates each string as
 * well-formed UTF-8, copies it into one contiguous buffer and counts its UTF-16 length; one `decode` call
 * then yields all strings joined, and each is a `slice` of that. Well-formed UTF-8 decodes the same joined
 * or apart, so the result equals per-string decoding; a malformed string (which a lossy decoder would
 * repair with U+FFFD, possibly differently at a join) is decoded on its own instead.
 * @module
 */

/** Lossy UTF-8 decoder that keeps a leading U+FEFF (a token may start with one). */
export const UTF8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

/**
 * Decodes `count` consecutive GGUF strings starting at `posBytes`, or returns undefined when they do not all
 * lie within `buf` (the caller then takes the checked slow path, which reports or reads more).
 * @returns the strings and the offset just past the last one
 */
export function decodeStringRun(
  buf: Uint8Array,
  posBytes: number,
  count: number,
): { values: string[]; endBytes: number } | undefined {
  const end = buf.length;
  // Every string needs at least its 8-byte length, so this also bounds the allocations below by the buffer.
  if (count * 8 > end - posBytes) return undefined;
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const starts = new Uint32Array(count);
  const lens = new Uint32Array(count);
  let pos = posBytes;
  let total = 0;
  for (let i = 0; i < count; i++) {
    if (pos + 8 > end) return undefined;
    const lo = dv.getUint32(pos, true);
    if (dv.getUint32(pos + 4, true) !== 0 || lo > end - pos - 8) return undefined;
    starts[i] = pos + 8;
    lens[i] = lo;
    total += lo;
    pos += 8 + lo;
  }
  const endBytes = pos;

  // UTF-16 length of each well-formed string, or -1 for a malformed one.
  const units = new Int32Array(count);
  const joined = new Uint8Array(total);
  let w = 0;
  for (let i = 0; i < count; i++) {
    const s = starts[i]!;
    const e = s + lens[i]!;
    const w0 = w;
    let n = 0;
    let p = s;
    let ok = true;
    while (p < e) {
      const b = buf[p]!;
      if (b < 0x80) {
        joined[w++] = b;
        p++;
        n++;
        continue;
      }
      // Second-byte range and sequence length per lead byte (Unicode Table 3-7, well-formed sequences).
      let len: number;
      let lo2 = 0x80;
      let hi2 = 0xbf;
      if (b >= 0xc2 && b <= 0xdf) len = 2;
      else if (b >= 0xe0 && b <= 0xef) {
        len = 3;
        if (b === 0xe0) lo2 = 0xa0;
        else if (b === 0xed) hi2 = 0x9f;
      } else if (b >= 0xf0 && b <= 0xf4) {
        len = 4;
        if (b === 0xf0) lo2 = 0x90;
        else if (b === 0xf4) hi2 = 0x8f;
      } else {
        ok = false;
        break;
      }
      if (p + len > e) {
        ok = false;
        break;
      }
      const b2 = buf[p + 1]!;
      if (b2 < lo2 || b2 > hi2) {
        ok = false;
        break;
      }
      for (let k = 2; k < len; k++) {
        const c = buf[p + k]!;
        if (c < 0x80 || c > 0xbf) ok = false;
      }
      if (!ok) break;
      for (let k = 0; k < len; k++) joined[w++] = buf[p + k]!;
      p += len;
      n += len === 4 ? 2 : 1;
    }
    if (ok) {
      units[i] = n;
    } else {
      units[i] = -1;
      w = w0;
    }
  }

  const all = UTF8.decode(joined.subarray(0, w));
  const values: string[] = new Array(count);
  let u = 0;
  for (let i = 0; i < count; i++) {
    const n = units[i]!;
    if (n >= 0) {
      values[i] = all.slice(u, u + n);
      u += n;
    } else {
      values[i] = UTF8.decode(buf.subarray(starts[i]!, starts[i]! + lens[i]!));
    }
  }
  return { values, endBytes };
}
