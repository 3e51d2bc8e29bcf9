// Reading numpy's files in the playground, with no library: .npy (np.save) and .npz (np.savez, a zip of .npy files;
// np.savez_compressed's deflated entries through the browser's DecompressionStream("deflate-raw")).
// The arrays are never decoded into numbers here: a little-endian C-order array's bytes are already the service's
// base64 tensor form once encoded, so the page sends them as they are. Errors are NpyError, with a message for people.
"use strict";

window.npyFiles = (() => {
  class NpyError extends Error {}

  // The dtypes the service takes as tensors, by their .npy descr (little-endian floats).
  const FLOATS = { "<f2": "float16", "<f4": "float32", "<f8": "float64" };
  const KINDS = { b: "bool", i: "int", u: "uint", f: "float", c: "complex", U: "str", S: "bytes", O: "object", M: "datetime64", m: "timedelta64", V: "void" };

  // The dtype a descr names, in words: '<i8' is "int64", '>f4' "big-endian float32".
  function dtypeName(descr) {
    const m = /^([<>|=]?)([a-zA-Z])(\d*)$/.exec(descr);
    if (!m || !(m[2] in KINDS)) return `'${descr}'`;
    const bits = m[3] && !"USOV".includes(m[2]) ? String(Number(m[3]) * 8) : "";
    const kind = m[2] === "b" ? "bool" : `${KINDS[m[2]]}${bits}`;
    return m[1] === ">" && Number(m[3]) > 1 ? `big-endian ${kind}` : kind;
  }

  const MAGIC = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]; // \x93NUMPY
  const startsWith = (bytes, prefix) => prefix.every((b, i) => bytes[i] === b);

  // A .npy file's header and data: {dtype, descr, shape, data (its bytes, a view), version}. Refuses what the service
  // cannot take as a float tensor as it is: Fortran order, other dtypes, big-endian floats.
  function parseNpy(bytes, what) {
    const name = what || "the file";
    if (bytes.length < 10 || !startsWith(bytes, MAGIC)) throw new NpyError(`${name} is not a .npy file (no \\x93NUMPY magic at its start)`);
    const major = bytes[6];
    const minor = bytes[7];
    if (major < 1 || major > 3) throw new NpyError(`${name}: .npy format version ${major}.${minor} is not one this page reads (1.0, 2.0, 3.0)`);
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const start = major === 1 ? 10 : 12;
    if (bytes.length < start) throw new NpyError(`${name}: the .npy header is cut short`);
    const length = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
    if (start + length > bytes.length) throw new NpyError(`${name}: the .npy header is cut short`);
    const header = new TextDecoder(major === 3 ? "utf-8" : "latin1").decode(bytes.subarray(start, start + length));
    const descr = /['"]descr['"]\s*:\s*['"]([^'"]*)['"]/.exec(header);
    const fortran = /['"]fortran_order['"]\s*:\s*(True|False)/.exec(header);
    const shapeText = /['"]shape['"]\s*:\s*\(([^)]*)\)/.exec(header);
    if (!descr) {
      const structured = /['"]descr['"]\s*:\s*\[/.test(header);
      throw new NpyError(`${name}: ${structured ? "a structured dtype (named fields)" : "no dtype in the header"}; the stack must be float16, float32 or float64`);
    }
    if (!fortran || !shapeText) throw new NpyError(`${name}: the .npy header lacks ${!fortran ? "fortran_order" : "shape"}`);
    const parts = shapeText[1].split(",").map((s) => s.trim()).filter((s) => s.length > 0);
    if (parts.some((p) => !/^\d+L?$/.test(p))) throw new NpyError(`${name}: the shape (${shapeText[1]}) is not a tuple of whole numbers`);
    const shape = parts.map((p) => Number.parseInt(p, 10));
    const dtype = FLOATS[descr[1]];
    if (!dtype) {
      const which = dtypeName(descr[1]);
      const hint = which.startsWith("big-endian") ? ` (save it little-endian: a.astype("${descr[1].replace(">", "<")}"))` : "";
      throw new NpyError(`${name}: dtype ${which} ('${descr[1]}'): the stack must be float16, float32 or float64, little-endian${hint}`);
    }
    if (fortran[1] === "True" && shape.filter((n) => n > 1).length > 1) {
      throw new NpyError(`${name}: Fortran order (column-major) is not read here: save a C-order array (np.ascontiguousarray(a))`);
    }
    const itemsize = Number(descr[1].slice(2));
    const size = shape.reduce((a, b) => a * b, 1);
    const offset = start + length;
    if (bytes.length - offset < size * itemsize) {
      throw new NpyError(`${name}: the data is cut short: shape (${shape.join(", ")}) of ${dtype} needs ${size * itemsize} bytes, the file has ${bytes.length - offset}`);
    }
    return { dtype, descr: descr[1], shape, data: bytes.subarray(offset, offset + size * itemsize), version: `${major}.${minor}` };
  }

  // ------------------------------------------------------------------ .npz: a zip of .npy files

  const ZIP_LOCAL = 0x04034b50;
  const ZIP_CENTRAL = 0x02014b50;
  const ZIP_END = 0x06054b50;

  // The zip64 extended-information extra field (id 1) of a central directory entry: the values that were 0xffffffff.
  function zip64(view, start, end, entry) {
    let pos = start;
    while (pos + 4 <= end) {
      const id = view.getUint16(pos, true);
      const size = view.getUint16(pos + 2, true);
      if (id === 1) {
        let at = pos + 4;
        for (const field of ["size", "compressedSize", "offset"]) {
          if (entry[field] !== 0xffffffff) continue;
          entry[field] = Number(view.getBigUint64(at, true));
          at += 8;
        }
      }
      pos += 4 + size;
    }
  }

  // The entries of a zip: [{name, method, compressedSize, size, offset}], from its central directory.
  function zipEntries(bytes, name) {
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    let end = -1;
    for (let pos = bytes.length - 22; pos >= Math.max(0, bytes.length - 22 - 65535); pos--) {
      if (view.getUint32(pos, true) === ZIP_END) {
        end = pos;
        break;
      }
    }
    if (end < 0) throw new NpyError(`${name}: not a readable .npz (no zip directory at its end: is the file complete?)`);
    const count = view.getUint16(end + 10, true);
    let pos = view.getUint32(end + 16, true);
    if (count === 0xffff || pos === 0xffffffff) throw new NpyError(`${name}: a zip64 archive this large is not read here`);
    const entries = [];
    for (let i = 0; i < count; i++) {
      if (pos + 46 > bytes.length || view.getUint32(pos, true) !== ZIP_CENTRAL) throw new NpyError(`${name}: the zip directory is damaged`);
      const nameLength = view.getUint16(pos + 28, true);
      const extraLength = view.getUint16(pos + 30, true);
      const commentLength = view.getUint16(pos + 32, true);
      const entry = {
        name: new TextDecoder().decode(bytes.subarray(pos + 46, pos + 46 + nameLength)),
        flags: view.getUint16(pos + 8, true),
        method: view.getUint16(pos + 10, true),
        compressedSize: view.getUint32(pos + 20, true),
        size: view.getUint32(pos + 24, true),
        offset: view.getUint32(pos + 42, true),
      };
      zip64(view, pos + 46 + nameLength, pos + 46 + nameLength + extraLength, entry);
      entries.push(entry);
      pos += 46 + nameLength + extraLength + commentLength;
    }
    return entries;
  }

  async function inflateRaw(data) {
    if (typeof DecompressionStream === "undefined") throw new NpyError("this browser cannot inflate (no DecompressionStream): save with np.savez, not np.savez_compressed");
    let stream;
    try {
      stream = new Blob([data]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
    } catch (e) {
      throw new NpyError("this browser cannot inflate deflate-raw: save with np.savez, not np.savez_compressed");
    }
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  // One entry's bytes, stored (np.savez) or deflated (np.savez_compressed).
  async function entryBytes(bytes, entry, name) {
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const at = entry.offset;
    if (at + 30 > bytes.length || view.getUint32(at, true) !== ZIP_LOCAL) throw new NpyError(`${name}: entry ${entry.name} is damaged`);
    if (entry.flags & 1) throw new NpyError(`${name}: entry ${entry.name} is encrypted`);
    const start = at + 30 + view.getUint16(at + 26, true) + view.getUint16(at + 28, true);
    const data = bytes.subarray(start, start + entry.compressedSize);
    if (data.length < entry.compressedSize) throw new NpyError(`${name}: entry ${entry.name} is cut short`);
    if (entry.method === 0) return data;
    if (entry.method === 8) {
      try {
        return await inflateRaw(data);
      } catch (e) {
        if (e instanceof NpyError) throw e;
        throw new NpyError(`${name}: entry ${entry.name} does not inflate (${e.message})`);
      }
    }
    throw new NpyError(`${name}: entry ${entry.name} is compressed with zip method ${entry.method}; only stored (np.savez) and deflated (np.savez_compressed) entries are read`);
  }

  // A file the user chose: {kind: "npy" | "npz", arrays: [{name, array} or {name, error}]}. An .npz's arrays are
  // named as np.load names them (the entry's name without ".npy"); an entry that cannot be read carries its error.
  async function readFile(fileName, buffer) {
    const bytes = new Uint8Array(buffer);
    if (startsWith(bytes, MAGIC)) return { kind: "npy", arrays: [{ name: fileName.replace(/\.npy$/i, ""), array: parseNpy(bytes, fileName) }] };
    if (!startsWith(bytes, [0x50, 0x4b])) throw new NpyError(`${fileName} is neither a .npy file (\\x93NUMPY) nor a .npz (a zip)`);
    const entries = zipEntries(bytes, fileName).filter((e) => !e.name.endsWith("/"));
    if (entries.length === 0) throw new NpyError(`${fileName}: the .npz holds no arrays`);
    const arrays = [];
    for (const entry of entries) {
      const name = entry.name.replace(/\.npy$/, "");
      try {
        arrays.push({ name, array: parseNpy(await entryBytes(bytes, entry, fileName), `${fileName}[${name}]`) });
      } catch (e) {
        if (!(e instanceof NpyError)) throw e;
        arrays.push({ name, error: e.message });
      }
    }
    return { kind: "npz", arrays };
  }

  // Bytes as base64 (btoa takes a binary string: built in chunks, so that large arrays do not overflow the stack).
  function base64(bytes) {
    let binary = "";
    for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    return btoa(binary);
  }

  return { NpyError, parseNpy, readFile, base64, dtypeName };
})();
