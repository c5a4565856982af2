/* wsup_client.h: the C ABI of the weight-holder client, for engines written
 * in other languages (Python through ctypes, Rust, C).
 *
 * Plain C: opaque handles, NUL-terminated UTF-8 strings, fixed-width
 * integers; no C++ types cross this boundary and no exception escapes it.
 *
 * Usage:
 *   wsup_attachment* a = wsup_attach(socket, "client", NULL, "/models/x", NULL);
 *   if (wsup_status(a) != 0) { puts(wsup_error(a)); }
 *   else if (!wsup_from_holder(a)) { load from disk; record wsup_reason(a) }
 *   else { p = wsup_tensor_data(a, "model.embed_tokens.weight"); ... }
 *   wsup_detach(a);
 *
 * wsup_attach always returns a handle (NULL only when out of memory), even
 * on failure, so that the error text has an owner; every handle must be
 * released with wsup_detach. Strings returned by the accessors belong to the
 * handle and stay valid until wsup_detach. Pointers to tensor data are host
 * pointers for a host arena and CUDA device pointers for a cuda arena
 * (wsup_is_cuda); they stay valid until wsup_detach, even if the holder dies.
 *
 * Thread-safety: a handle may be read from several threads at once; attach
 * and detach must not race with other calls on the same handle.
 */
#ifndef WSUP_CLIENT_H_
#define WSUP_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wsup_attachment wsup_attachment;

/* Status codes (wsup_status). 0 means the call did what the mode asks: either
 * attached, or decided to load from disk (client and off modes). */
enum {
  WSUP_OK = 0,
  WSUP_ERR_INVALID_ARGUMENT = 1,
  WSUP_ERR_NOT_FOUND = 2,
  WSUP_ERR_IO = 3,
  WSUP_ERR_CORRUPT = 4,
  WSUP_ERR_REFUSED = 5,
  WSUP_ERR_MISMATCH = 6,
  WSUP_ERR_TIMEOUT = 7,
  WSUP_ERR_UNAVAILABLE = 8,
  WSUP_ERR_INTERNAL = 9
};

/* Connects to the holder at socket_path and attaches in `mode` ("daemon",
 * "client" or "off"). The client's fingerprint is either
 *   fingerprint_json: a JSON object of string fields (as the holder sends), or
 *   checkpoint_dir:   a checkpoint folder; its headers (not its tensors) are
 *                     read and the fingerprint computed as the holder does.
 * Exactly one of the two must be given (both may be NULL in mode "off").
 * options_json may be NULL or a JSON object with any of:
 *   "client_name": string   (default "engine")
 *   "timeout_ms":  integer  (default 10000)
 *   "device":      integer  cuda ordinal to map on (default 0)
 *   and, with checkpoint_dir: "backend" ("host"|"cuda", default "host"),
 *   "tp_size", "tp_rank", "pp_size", "pp_rank", "dp_size", "ep_size",
 *   "ep_rank" (integers), "revision" (string). */
wsup_attachment* wsup_attach(const char* socket_path, const char* mode, const char* fingerprint_json,
                             const char* checkpoint_dir, const char* options_json);

/* WSUP_OK or an error code; the message names the cause and the fix. */
int wsup_status(const wsup_attachment* a);
const char* wsup_error(const wsup_attachment* a); /* "" when none */

/* The outcome: 1 when the weights come from the holder, 0 when the caller
 * must load from disk (then wsup_reason says why). */
int wsup_from_holder(const wsup_attachment* a);
/* "holder" or "disk"; "published" after this handle's own wsup_publish_commit. */
const char* wsup_source(const wsup_attachment* a);
const char* wsup_reason(const wsup_attachment* a); /* "" when attached */
/* The differing fingerprint fields: a JSON array of {field, ours, holder}. */
const char* wsup_diffs_json(const wsup_attachment* a);
double wsup_attach_ms(const wsup_attachment* a);
/* The holder's fingerprint as a JSON object ("{}" when not attached). */
const char* wsup_holder_fingerprint_json(const wsup_attachment* a);

/* 1 when tensor pointers are CUDA device pointers. */
int wsup_is_cuda(const wsup_attachment* a);
size_t wsup_num_tensors(const wsup_attachment* a);
/* Names in manifest order, for i < wsup_num_tensors; NULL when out of range. */
const char* wsup_tensor_name(const wsup_attachment* a, size_t i);

/* Lookups by name (O(1)). Absent names give NULL / -1 / 0. */
const void* wsup_tensor_data(const wsup_attachment* a, const char* name);
const char* wsup_tensor_dtype(const wsup_attachment* a, const char* name); /* "F32", "BF16", "F8_E4M3", ... */
int wsup_tensor_ndim(const wsup_attachment* a, const char* name);
/* Dimension i of the (local, per-rank) shape; -1 when out of range. */
int64_t wsup_tensor_dim(const wsup_attachment* a, const char* name, int i);
uint64_t wsup_tensor_nbytes(const wsup_attachment* a, const char* name);
/* Stride of dimension i in elements (the contiguous row-major one for a
 * tensor stored without strides); -1 when absent or out of range. */
int64_t wsup_tensor_stride(const wsup_attachment* a, const char* name, int i);
/* Copies a tensor into host memory (works for host and cuda arenas).
 * Returns WSUP_OK, or an error code when absent or dst_len is too small. */
int wsup_tensor_copy_to_host(const wsup_attachment* a, const char* name, void* dst, uint64_t dst_len);

/* ---- Engine-made layouts (a holder started with --layout engine) ----
 *
 * The first engine to ask for a layout nobody has committed gets the write
 * lease: it asks the holder for memory, writes its own post-load tensors
 * into it, and commits their names, dtypes, shapes, strides and offsets.
 * The holder checks the commit (bounds, overlaps, dtypes, sizes, duplicate
 * names) and seals the memory; every later engine with the same
 * fingerprint attaches the layout. Engines that ask while it is being
 * written wait for the commit (options "wait_ms", default 600000).
 *
 *   a = wsup_publish_begin(sock, "daemon", NULL, "/models/x",
 *       "{\"engine\":\"my-engine\",\"engine_version\":\"1.2\",\"transform\":\"fused-qkv\"}");
 *   if (wsup_status(a) != 0) { puts(wsup_error(a)); }
 *   else if (wsup_from_holder(a)) { attached: wsup_tensor_data(a, name) }
 *   else if (wsup_has_lease(a)) {
 *     void* p; uint64_t size; uint32_t alloc;
 *     wsup_publish_alloc(a, bytes, &p, &size, &alloc);   write tensors into p
 *     if (wsup_publish_commit(a, "[{\"name\":\"w\",\"dtype\":\"BF16\",\"shape\":[4,8],"
 *                                "\"alloc\":0,\"offset\":0}]") == WSUP_OK)
 *       { attached, wsup_source(a) is "published": use wsup_tensor_data }
 *     else { puts(wsup_error(a)); fix and commit again, or wsup_publish_abort }
 *   }
 *   else { load from disk (client mode); wsup_reason(a) says why }
 *   wsup_detach(a);   before a commit: gives the lease up, the memory is released
 *
 * wsup_publish_begin takes wsup_attach's arguments; options_json also takes
 * "engine", "engine_version" (both required unless fingerprint_json already
 * names them), "transform" (what the engine does to the checkpoint's
 * tensors: fusions, repacking, quantization) and "wait_ms" (integer). The
 * layout's fingerprint is the checkpoint's plus these, so another revision,
 * engine or transform is another layout.
 *
 * wsup_publish_alloc: `bytes` more bytes from the holder, mapped read-write
 * at *data (*size: rounded up; *alloc: the allocation's index for entries).
 * The pointers are valid until the commit or the abort. Host holders only
 * in this version.
 * wsup_publish_commit: entries_json is a JSON array of objects {name, dtype,
 * shape, alloc, offset} with optional strides (elements, one per
 * dimension) and nbytes (default: what shape and strides span). Offsets are
 * multiples of 256. The hash is computed here. On WSUP_OK the handle is
 * attached to the committed layout; otherwise wsup_error names what the
 * holder refused and the lease is kept.
 * Each returns WSUP_OK or an error code (wsup_error then says why);
 * WSUP_ERR_INVALID_ARGUMENT for a handle without the lease. */
wsup_attachment* wsup_publish_begin(const char* socket_path, const char* mode, const char* fingerprint_json,
                                    const char* checkpoint_dir, const char* options_json);
/* 1 while this handle holds the write lease (after wsup_publish_begin, until
 * the commit or the abort). */
int wsup_has_lease(const wsup_attachment* a);
int wsup_publish_alloc(wsup_attachment* a, uint64_t bytes, void** data, uint64_t* size, uint32_t* alloc);
int wsup_publish_commit(wsup_attachment* a, const char* entries_json);
int wsup_publish_abort(wsup_attachment* a, const char* reason);

/* Closes the connection, unmaps, frees the handle. NULL is fine. */
void wsup_detach(wsup_attachment* a);

/* The library's version, "major.minor.patch". */
const char* wsup_client_version(void);

#ifdef __cplusplus
}
#endif

#endif /* WSUP_CLIENT_H_ */
