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
#include <sys/types.h> /* ssize_t, for the torch allocator's entry points */

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
 *   "ep_rank" (integers), "revision" (string).
 * To attach an engine-made layout (a holder started with --layout engine)
 * give the engine's identity as wsup_publish_begin takes it: "engine",
 * "engine_version", "transform" (added to the fingerprint), and "wait_ms"
 * (integer, default 0) to wait that long for a layout another engine is
 * still writing. */
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

/* 1 when tensor pointers are CUDA device pointers; for a handle that holds
 * a write lease, 1 when the lease's memory (wsup_publish_alloc) is. */
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

/* ---- The whole manifest in one call ----
 *
 * wsup_manifest_table returns every tensor's description in one block of
 * memory: what the lookups above answer, for all tensors at once. A caller
 * that reads every tensor (a Python client through ctypes, which pays for
 * each foreign call) reads the block instead of making six calls per tensor.
 *
 *   size_t len;
 *   const char* t = wsup_manifest_table(a, &len);
 *   const wsup_manifest_header* h = (const void*)t;
 *   const int64_t* dims = (const void*)(t + h->dims_offset);
 *   const char* strings = t + h->strings_offset;
 *   for (uint64_t i = 0; i < h->count; ++i) {
 *     const wsup_tensor_record* r = (const void*)(t + h->header_bytes + i * h->record_bytes);
 *     name = strings + r->name_offset;  dtype = strings + r->dtype_offset;
 *     shape = dims + r->dims_index;     strides = shape + r->ndim;
 *     data = (const void*)(uintptr_t)r->data;
 *   }
 *
 * Layout, version 1, in the machine's byte order (every field is 8-byte
 * aligned; the block starts 8-byte aligned):
 *   header   wsup_manifest_header, header_bytes (64) bytes;
 *   records  `count` wsup_tensor_record of record_bytes (64) bytes each, in
 *            manifest order (the order of wsup_tensor_name), right after
 *            the header;
 *   dims     int64 values from dims_offset: for each distinct (shape,
 *            strides) of the tensors, the shape (ndim values, as
 *            wsup_tensor_dim) followed by the strides (ndim values in
 *            elements, as wsup_tensor_stride: the contiguous row-major ones
 *            for a tensor stored without strides). Tensors of the same
 *            shape and strides share one dims_index; with the header flag
 *            WSUP_MANIFEST_DIMS_UNIQUE, tensors of different shapes or
 *            strides never do (a scalar's empty dims take one unused
 *            element), so dims_index alone names the shape;
 *   strings  strings_bytes bytes from strings_offset: the distinct dtype
 *            spellings, then every tensor's name in record order; each
 *            string is followed by one NUL (names hold no NUL: holders
 *            refuse control characters). Tensors of one dtype share one
 *            dtype_offset.
 * Sharing keeps the block small and lets a reader make one object per
 * distinct shape or dtype instead of one per tensor; a reader that ignores
 * it and reads each record's offsets gets the same answers.
 * total_bytes is the block's size (also *len). A later version may append
 * fields to the header or to each record (header_bytes and record_bytes
 * grow; step by them) and raises `version` only for changes a version-1
 * reader would misread.
 *
 * Built on the first call and kept on the handle; later calls return the
 * same block. The block, like the strings of the accessors, stays valid
 * until wsup_detach (a wsup_publish_commit re-attaches the handle: ask
 * again after it). A handle that has not attached (wsup_from_holder is 0),
 * a NULL handle, or no memory for the block: NULL, with *len = 0. len may
 * be NULL. */
#define WSUP_MANIFEST_MAGIC "wsupMTAB" /* the header's 8 magic bytes, no NUL */
#define WSUP_MANIFEST_VERSION 1
#define WSUP_MANIFEST_STRIDED 1u /* header flag: some tensor is not contiguous row-major */
#define WSUP_MANIFEST_DIMS_UNIQUE 2u /* header flag: one dims_index per distinct shape and strides */

typedef struct wsup_manifest_header {
  char magic[8];           /* WSUP_MANIFEST_MAGIC */
  uint32_t version;        /* WSUP_MANIFEST_VERSION */
  uint32_t header_bytes;   /* 64: where the records start */
  uint32_t record_bytes;   /* 64: the step from one record to the next */
  uint32_t flags;          /* WSUP_MANIFEST_STRIDED | WSUP_MANIFEST_DIMS_UNIQUE, or 0 */
  uint64_t count;          /* records: wsup_num_tensors */
  uint64_t dims_offset;    /* bytes from the block's start to the dims */
  uint64_t strings_offset; /* bytes from the block's start to the strings */
  uint64_t strings_bytes;
  uint64_t total_bytes;    /* the block's size */
} wsup_manifest_header;

typedef struct wsup_tensor_record {
  uint64_t data;         /* the tensor's address, as wsup_tensor_data (a CUDA
                            device pointer when wsup_is_cuda) */
  uint64_t nbytes;       /* as wsup_tensor_nbytes */
  uint64_t name_offset;  /* the name in the strings, NUL-terminated */
  uint64_t name_bytes;   /* its length, NUL not counted */
  uint64_t dtype_offset; /* the dtype ("F32", "BF16", ...), NUL-terminated */
  uint64_t dtype_bytes;  /* its length, NUL not counted */
  uint64_t ndim;         /* as wsup_tensor_ndim */
  uint64_t dims_index;   /* the shape at dims[dims_index], the strides at dims[dims_index + ndim] */
} wsup_tensor_record;

const void* wsup_manifest_table(const wsup_attachment* a, size_t* len);

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
 * at *data (*size: rounded up to the holder's granularity; *alloc: the
 * allocation's index for entries). A host holder grants a memfd and *data
 * is a host pointer; a cuda holder (--backend cuda) grants VMM memory on
 * its GPU, which is imported and mapped on the device of option "device"
 * (that GPU, found by its uuid), and *data is a CUDA device pointer
 * (write it with cudaMemcpy or kernels in the device's primary context,
 * which the CUDA runtime uses). The addresses never change: a refused
 * commit leaves them as they are, and after a commit they are the
 * committed layout's tensors (wsup_tensor_data gives the same pointers):
 * read-only for host (no access at all during the commit), read-write on
 * cuda, where writing after the commit is forbidden by contract (every
 * reader sees it). They stay valid until wsup_detach, and past it for
 * blocks the torch allocator below still holds. After an abort they are
 * gone.
 * wsup_publish_commit: entries_json is a JSON array of objects {name, dtype,
 * shape, alloc, offset} with optional strides (elements, one per
 * dimension) and nbytes (default: what shape and strides span). Offsets are
 * multiples of 256. The hash is computed here. On cuda every write queued
 * on the device is waited for first. On WSUP_OK the handle is attached to
 * the committed layout; otherwise wsup_error names what the holder refused
 * and the lease is kept.
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
/* Which grant holds `ptr` (any address inside memory from
 * wsup_publish_alloc or wsup_torch_malloc on this handle's lease), and its
 * byte offset there: what an entry's alloc and offset are. WSUP_OK,
 * WSUP_ERR_NOT_FOUND when no grant holds it, WSUP_ERR_INVALID_ARGUMENT
 * for a handle without the lease or NULL outputs. Sets no error text. */
int wsup_publish_locate(const wsup_attachment* a, const void* ptr, uint32_t* alloc, uint64_t* offset);
/* Wall milliseconds this handle's lease has spent getting grants so far
 * (wsup_publish_alloc and the torch allocator's: the holder's round trips
 * and the mappings); 0 for a handle without the lease. */
double wsup_publish_grant_ms(const wsup_attachment* a);

/* ---- The torch allocator: a model's tensors carved out of a lease ----
 *
 * torch.cuda.memory.CUDAPluggableAllocator(path_of_this_library,
 * "wsup_torch_malloc", "wsup_torch_free") with a torch.cuda.MemPool over it
 * makes torch allocate inside one publication's write lease: the target,
 * set with wsup_publish_set_allocator_target. Then a model's own loader
 * (from_pretrained) writes its post-load tensors straight into memory the
 * holder granted, and a commit names them in place (wsup_publish_locate
 * turns a tensor's data pointer into its alloc and offset). The Python
 * client does all of this: wsup_client.publish(...).torch_pool().
 *
 * Carving: the allocator asks the holder for grants of max(size, the chunk
 * size: 1 GiB unless wsup_torch_set_chunk_bytes says otherwise) and hands
 * out blocks of them first fit, 512-byte aligned; freed blocks are reused
 * and merge with free neighbours (inside one grant: a block never spans
 * two). Grants are the layout's for good: memory freed stays in the lease
 * for later blocks. `stream` is ignored; `device` must be the lease's
 * (any value for a host lease, which these calls also serve, for tests).
 *
 * wsup_torch_malloc returns NULL on any failure (no target, a lease that
 * was committed or given up, a grant the holder refused, another device);
 * the message is then wsup_error of the target and wsup_torch_last_error().
 * wsup_torch_free of a block takes it back; of anything else, it records
 * the error there and changes nothing. Blocks of a lease stay mapped until
 * they are freed, even after the commit, the abort or the handle's
 * wsup_detach: a torch tensor is never left pointing at unmapped memory.
 * After the commit (or abort) no more blocks come from that lease.
 *
 * All of these may be called from any thread; they serialize on one lock,
 * which the other wsup_publish_* calls take too. */
/* Makes `a` (a handle that holds its lease) the target; NULL clears the
 * target (blocks already handed out stay valid). WSUP_OK, or an error
 * code with wsup_error(a) saying why. */
int wsup_publish_set_allocator_target(wsup_attachment* a);
void* wsup_torch_malloc(ssize_t size, int device, void* stream);
void wsup_torch_free(void* ptr, ssize_t size, int device, void* stream);
/* The least a new grant asks for, from now on (0: back to 1 GiB). */
int wsup_torch_set_chunk_bytes(uint64_t bytes);
/* Gets the pool of `a` (the target, or a handle that was) a grant of
 * max(bytes, the chunk size) now, so that the loader's first allocations
 * find it ready: called on a thread of its own while the loader builds its
 * model, it takes the holder's round trip and the mapping off the load.
 * wsup_torch_malloc waits while it runs. WSUP_OK, or an error code with
 * wsup_error(a) saying why (no pool: set the target first). */
int wsup_torch_reserve(wsup_attachment* a, uint64_t bytes);
/* The last failure of wsup_torch_malloc or wsup_torch_free in this process
 * ("" when none); valid until the calling thread's next call of it. */
const char* wsup_torch_last_error(void);
/* What the allocator holds of `a`'s lease: bytes granted, bytes in live
 * blocks, live blocks (all 0 when it never was a target). */
int wsup_torch_usage(const wsup_attachment* a, uint64_t* granted_bytes, uint64_t* used_bytes, uint64_t* blocks);

/* Closes the connection, unmaps, frees the handle (before a commit: gives
 * the lease up). Blocks of its lease that the torch allocator still holds
 * stay mapped until wsup_torch_free. NULL is fine. */
void wsup_detach(wsup_attachment* a);

/* ---- The node's KV pool and its journal (docs/kv_journal.md) ----
 *
 * An engine that keeps its KV cache in the node's pool, and journals its
 * sequences there so that the engine promoted after its crash can adopt
 * their pages, gets the pool from its rank's holder:
 *
 *   wsup_kv_pool* p = wsup_kv_pool_fetch("/run/wsup/holder.sock", 5000);
 *   if (wsup_kv_pool_status(p) != WSUP_OK) { log(wsup_kv_pool_error(p)); }
 *   for (size_t i = 0; i < wsup_kv_pool_allocations(p); ++i)
 *     map(dup(wsup_kv_pool_fd(p, i)), wsup_kv_pool_allocation_bytes(p, i));
 *   wsup_kv_pool_release(p);
 *
 * Host pools are writable memfds (mmap MAP_SHARED); cuda pools are POSIX
 * fds of VMM allocations (cuMemImportFromShareableHandle). Nothing is
 * mapped here: an engine maps the pool only while the supervisor makes it
 * the owner (POST /wsup/role {"role": "active", "kv": "pool"}) and unmaps
 * it before it answers {"role": "standby"}. The journal's layout, its
 * versioning and how pages are named are in docs/kv_journal.md. */
typedef struct wsup_kv_pool wsup_kv_pool;

/* Asks the holder at socket_path for its pool, waiting at most timeout_ms
 * (> 0). Never NULL but when out of memory; check wsup_kv_pool_status. A
 * holder without a pool is WSUP_ERR_NOT_FOUND, naming the flag that makes
 * one. */
wsup_kv_pool* wsup_kv_pool_fetch(const char* socket_path, int timeout_ms);
int wsup_kv_pool_status(const wsup_kv_pool* p);
const char* wsup_kv_pool_error(const wsup_kv_pool* p); /* "" when none */
/* The pool's description: {"id": "<32 hex>", "backend": "host"|"cuda",
 * "device": N, "allocations": [bytes, ...]} ("{}" after a failure). */
const char* wsup_kv_pool_json(const wsup_kv_pool* p);
size_t wsup_kv_pool_allocations(const wsup_kv_pool* p);
/* Allocation i's fd, which the handle owns (dup() one to keep past
 * wsup_kv_pool_release), and its size; -1 and 0 past the end. */
int wsup_kv_pool_fd(const wsup_kv_pool* p, size_t i);
uint64_t wsup_kv_pool_allocation_bytes(const wsup_kv_pool* p, size_t i);
/* Closes the fds and frees the handle. NULL is fine. */
void wsup_kv_pool_release(wsup_kv_pool* p);

/* The journal's TokenHash: FNV-1a 64 over each id as 4 little-endian
 * bytes, extending `seed` (WSUP_KV_TOKEN_HASH_SEED for no tokens yet). */
#define WSUP_KV_TOKEN_HASH_SEED 0xcbf29ce484222325ull
uint64_t wsup_kv_token_hash(const int32_t* ids, size_t n, uint64_t seed);

/* Arms this process's death word when its supervisor gave it one
 * (WSUP_DEATH_FD in the environment; docs/architecture.md, "Crash of the
 * active engine"): one thread of the library's own then sleeps for ever,
 * and the kernel tells the supervisor of this process's death the moment
 * it dies, before tearing it down, so the traffic moves tens of ms sooner.
 * Call it once, early (before loading). Returns 1 when armed, 0 when the
 * variable is unset (nothing to do), or minus an error code (-WSUP_ERR_*)
 * with the message, which names the variable and the fix, copied into err (at most
 * err_len bytes, NUL-terminated; err may be NULL). The engine works either
 * way: without a death word its death is seen through its lifeline. */
int wsup_arm_death_word(char* err, size_t err_len);

/* The library's version, "major.minor.patch". */
const char* wsup_client_version(void);

#ifdef __cplusplus
}
#endif

#endif /* WSUP_CLIENT_H_ */
