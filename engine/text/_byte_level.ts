/**
 * The GPT-2 byte-level alphabet (spec `chat.md` §4.1 step 4): every byte value maps to one printable code
 * point so that byte-level BPE vocabularies can store arbitrary bytes as text.
 * @module
 */

/** Whether byte `b` keeps its own value as code point (printable Latin-1, excluding the soft hyphen). */
function isPrintable(b: number): boolean {
  return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

function buildByteToCodePoint(): Uint16Array {
  const out = new Uint16Array(256);
  // The 68 non-printable byte values, taken in increasing order, map to 256, 257, ... 323.
  let next = 256;
  for (let b = 0; b < 256; b++) out[b] = isPrintable(b) ? b : next++;
  return out;
}

/** Code point of byte `b` in the byte-level alphabet; ne=[256]. */
export const BYTE_TO_CODE_POINT: Uint16Array = buildByteToCodePoint();

function buildCodePointToByte(): Int16Array {
  const out = new Int16Array(324).fill(-1);
  for (let b = 0; b < 256; b++) out[BYTE_TO_CODE_POINT[b]!] = b;
  return out;
}

/** Byte of a byte-level code point (index < 324), or -1 for code points outside the alphabet; ne=[324]. */
export const CODE_POINT_TO_BYTE: Int16Array = buildCodePointToByte();

/** The one-character string that byte `b` becomes in the byte-level alphabet. */
export function byteChar(b: number): string {
  return String.fromCharCode(BYTE_TO_CODE_POINT[b]!);
}

/**
 * The bytes a byte-level token text stands for, or undefined when some character is outside the alphabet
 * (such a text is not a byte-level token).
 */
export function byteLevelBytes(text: string): Uint8Array | undefined {
  const out = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    const b = c < 324 ? CODE_POINT_TO_BYTE[c]! : -1;
    if (b < 0) return undefined;
    out[i] = b;
  }
  return out;
}
