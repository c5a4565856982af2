// The holder protocol: how a weight holder and its clients (engines, the
// supervisor's fd keeper, `wsup cache` inspection) talk over a Unix stream
// socket.
//
// Wire format: every message is a 4-byte little-endian length followed by
// that many bytes of one JSON object with a "type" key. The length is checked
// against a bound (kMaxMessageBytes) before a byte of the body is buffered, so
// a hostile length prefix costs nothing. JSON size and nesting are bounded too
// (common/json_limits.h), so a message cannot exhaust the stack of whatever
// walks the parsed value. File descriptors travel with
// SCM_RIGHTS on the bytes of the message that carries them; the message says
// how many ("fds": N) so the receiver can tell a complete set from a lost one.
// More than kMaxFdsPerSend fds are spread over several sendmsg calls, each on
// its own slice of the message bytes. A message may have a binary part: it
// says "blob": B, and the next frame (length prefix exactly B) holds those B
// raw bytes, which belong to it. Only a receiver built to accept binary parts
// (a bound above 0) reads them so; the holder sends one only to a client that
// asked for it.
//
// Conversation (the client speaks first; one reply per request):
//   hello {version, client, role: engine|keeper|inspect, fingerprint?, tensor_table?,
//          publish?, wait_ms?}
//     -> attach {manifest, fingerprint, diffs, fds: N, blob?, layout?}   (+ N arena fds)
//      | mismatch {diffs: [{field, ours, holder}], message}
//      | error {code, message}
//      | lease {layout, ...}   (a holder of engine-made layouts only: see
//                               wire/layout_protocol.h for the writer's side)
//      | committed {layouts}   (a keeper on a holder of engine-made layouts:
//                               wire/layout_protocol.h, then keep -> kept)
//   info -> info {fingerprint, tensors, bytes, backend, allocations, clients, layout,
//                 layouts: [...], layout_max_bytes, layout_bytes,
//                 kv_pool?: {id, bytes, allocations, adopted}, ...}
//   kv_pool -> kv_pool {...} (+ fds) | error   (no hello needed: wire/kv_pool.h)
//   bye  -> (the holder closes the connection)
// The holder closes a connection that has no request in flight for its idle
// limit, and may close an idle one early to make room at its connection
// limit, telling the client why in an error frame first (holder/server.h).
// Neither touches what an attached client mapped. An attached keeper's
// connection has no idle limit, and is closed to make room only when no
// other connection is idle.
// An engine must present a fingerprint and gets `attach` only when every
// field matches. A keeper or an inspector may omit it and takes the holder's
// fingerprint as given; when an inspector presents one, the differences come
// back in `attach.diffs` instead of a refusal.
// A client that sends tensor_table: V (the highest binary tensor table
// version it reads, wire/manifest.h) gets the manifest's entries as that
// table in the attach message's binary part, and a manifest header that
// announces it; a client that does not gets them as JSON, as before. A
// 20,000-tensor manifest is about 2 MiB either way, but the table decodes
// many times faster.
//
// This file holds the pieces both sides share: on top of the frames of
// wire/json_frame.h (EncodeFrame, FrameDecoder, whose default words and
// bound kMaxMessageBytes are this protocol's), fds and binary parts on a
// socket (OutgoingFrame, FrameReader), a blocking client channel with
// deadlines (Channel), the typed messages with their encoders and
// validating decoders, the arena record a keeper stores next to its fds, and
// the socket naming rule. Decoders never throw: every malformed input becomes an Error naming
// the message and the field.
//
// Thread-safety: values and single-owner objects; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/fingerprint.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "wire/json_frame.h"
#include "wire/layout_protocol.h"
#include "wire/manifest.h"

namespace wsup {

inline constexpr int kProtocolVersion = 1;
// Linux accepts at most 253 fds per sendmsg (SCM_MAX_FD); stay below it.
inline constexpr size_t kMaxFdsPerSend = 250;
// Longest client name accepted in a hello (it ends up in logs).
inline constexpr size_t kMaxClientNameBytes = 256;
// Largest binary part a client accepts (an attach reply's tensor table:
// about 110 bytes per tensor, so room for some 600,000 tensors).
inline constexpr uint32_t kMaxBlobBytes = 64u << 20;

enum class ClientRole { kEngine, kKeeper, kInspect };
const char* ClientRoleName(ClientRole role);
Result<ClientRole> ParseClientRole(std::string_view name);

// ---------------------------------------------------------------- framing

// One received message and the fds that came with it.
// json's destructor flattens deep values into a vector, which can only throw
// on out-of-memory; terminating there is the right end.
// NOLINTNEXTLINE(bugprone-exception-escape)
struct Frame {
  nlohmann::json msg;
  std::vector<UniqueFd> fds;
  std::string blob;          // the message's binary part; empty when none
  std::string type() const;  // msg["type"] when a string, else ""
};

// Parses one frame body in the holder protocol's words (wire/json_frame.h):
// a JSON object within the shared JSON limits. `what` names the peer in
// errors.
Result<nlohmann::json> ParseMessageBody(std::string_view body, const std::string& what);

// A message on its way out: its frame bytes and the fds that travel with it.
// SendSome() works on blocking and non-blocking sockets alike and may be
// called again after it reports that the socket would block.
class OutgoingFrame {
 public:
  OutgoingFrame() = default;
  // Sets msg["fds"] to fds.size() when fds are given, and msg["blob"] to the
  // binary part's size when one is given (shared, not copied: a holder sends
  // the same tensor table to every client).
  static Result<OutgoingFrame> Make(nlohmann::json msg, std::vector<UniqueFd> fds,
                                    uint32_t max_bytes = kMaxMessageBytes,
                                    std::shared_ptr<const std::string> blob = nullptr);
  // Bytes sent as they are, framed by the caller: a frame encoded
  // elsewhere, a line of another protocol, or, in tests of hostile peers,
  // bytes that are no frame at all.
  static OutgoingFrame Bytes(std::string bytes);

  // Sends as much as the socket takes now: true when everything went,
  // false when the socket would block. The fds are closed here once sent.
  Result<bool> SendSome(int sock);
  bool done() const { return sent_ == total_bytes() && fds_sent_ == fds_.size(); }
  size_t remaining_bytes() const { return total_bytes() - sent_; }

 private:
  size_t blob_bytes() const { return blob_ ? blob_->size() : 0; }
  size_t total_bytes() const { return bytes_.size() + blob_bytes(); }
  std::string bytes_;  // the message's frame, and the binary part's prefix
  std::shared_ptr<const std::string> blob_;
  size_t sent_ = 0;  // of bytes_ followed by *blob_
  std::vector<UniqueFd> fds_;
  size_t fds_sent_ = 0;
};

// Reads bytes (and, when accept_fds, SCM_RIGHTS fds) from a socket into a
// FrameDecoder, and pairs each completed message with the fds it announced.
// A side that accepts no fds reads without a control buffer, so fds a peer
// pushes at it are dropped by the kernel and never enter this process.
// Binary parts are read only with max_blob_bytes > 0 (FrameDecoder).
class FrameReader {
 public:
  FrameReader(uint32_t max_bytes, bool accept_fds, uint32_t max_blob_bytes = 0)
      : decoder_(max_bytes, max_blob_bytes), accept_fds_(accept_fds) {}

  enum class ReadState { kData, kWouldBlock, kEof };
  // One recvmsg of at most `budget` bytes.
  Result<ReadState> ReadSome(int sock, size_t budget);
  Result<std::optional<Frame>> Next();
  bool mid_message() const { return decoder_.mid_message(); }
  size_t buffered() const { return decoder_.buffered(); }
  uint32_t announced() const { return decoder_.announced(); }

 private:
  FrameDecoder decoder_;
  std::deque<UniqueFd> fds_;
  bool accept_fds_;
};

// Who listens on a socket, in the words of a channel's errors: its name
// ("the holder", "the supervisor") and what gets it listening there ("start
// wsup-holder with this --socket"), said when nothing does.
struct SocketPeer {
  std::string name;
  std::string start;
};
inline SocketPeer HolderPeer() { return {"the holder", "start wsup-holder with this --socket"}; }

// The client's side of a connection: blocking calls, each with a deadline.
class Channel {
 public:
  Channel() = default;
  // Connects to the socket that `peer` listens on: the holder's unless told
  // (the supervisor's and the front's control sockets are reached so too).
  // Errors name the path and the peer, and say whether nothing listens there
  // (kUnavailable, with peer.start), the socket is not ours to use
  // (kRefused) or the peer did not accept in time (kTimeout). The errors of
  // Send() and Receive() name the same peer.
  static Result<Channel> Connect(const std::string& socket_path, int timeout_ms,
                                 SocketPeer peer = HolderPeer());

  // Renames who answers on the socket, for the errors from here on.
  void set_peer(std::string peer) { peer_ = std::move(peer); }

  // `blob`, when given, is the message's binary part (a commit's tensor table).
  Status Send(const nlohmann::json& msg, std::vector<UniqueFd> fds, int timeout_ms,
              std::shared_ptr<const std::string> blob = nullptr);
  // Sends bytes as they are (OutgoingFrame::Bytes), within the same bound:
  // for a peer of another line protocol, or a test of a hostile peer.
  Status SendBytes(std::string bytes, int timeout_ms);
  Result<Frame> Receive(int timeout_ms);
  // Sends a request and waits for its reply. A holder that hung up before
  // taking the request (it turned the connection away) may have said why
  // first: that message is then the reply.
  Result<Frame> Call(const nlohmann::json& msg, int timeout_ms, std::shared_ptr<const std::string> blob = nullptr);

  bool connected() const { return fd_.valid(); }
  int fd() const { return fd_.get(); }
  const std::string& socket_path() const { return path_; }
  void Close() { fd_.Reset(); }

 private:
  Status SendFrame(OutgoingFrame frame, int timeout_ms);

  UniqueFd fd_;
  std::string path_;
  std::string peer_ = "the holder";
  FrameReader reader_{kMaxMessageBytes, true, kMaxBlobBytes};
};

// ---------------------------------------------------------------- messages

struct HelloMsg {
  int version = kProtocolVersion;
  std::string client;  // a name for logs, e.g. "engine-a"
  ClientRole role = ClientRole::kEngine;
  std::optional<Fingerprint> fingerprint;  // required for engines
  // The highest binary tensor table version this client reads; 0: none,
  // send the entries as JSON.
  uint32_t tensor_table = 0;
  // Engine-made layouts (wire/layout_protocol.h): this client writes the
  // layout when nobody has (it gets a lease), and waits up to wait_ms for
  // another client's commit (0: no waiting, an error at once).
  bool publish = false;
  uint64_t wait_ms = 0;
};

struct AttachMsg {
  Manifest manifest;
  Fingerprint fingerprint;                // the holder's
  std::vector<FingerprintDiff> diffs;     // inspect only: how the asker's differs
  // An engine-made layout's id in its holder and its LayoutHash(); 0 and ""
  // for a checkpoint arena.
  uint64_t layout_id = 0;
  std::string layout_hash;
};

struct MismatchMsg {
  std::vector<FingerprintDiff> diffs;
  std::string message;
};

struct ErrorMsg {
  std::string code;  // CodeName() of the holder's Error
  std::string message;
};

struct ClientEntry {
  std::string name;
  std::string role;
  int64_t pid = 0;
  int64_t uid = 0;
  bool attached = false;  // received an attach reply
};

inline constexpr size_t kMaxListedClients = 256;

// The node's KV pool as `info` reports it (wire/kv_pool.h has the pool's
// own message, which carries its fds).
struct KvPoolInfo {
  std::string id;
  uint64_t bytes = 0;
  uint64_t allocations = 0;
  bool adopted = false;  // the kept pool of a holder before this one
};

struct InfoMsg {
  Fingerprint fingerprint;
  uint64_t tensors = 0;
  uint64_t bytes = 0;        // sum of tensor sizes
  uint64_t arena_bytes = 0;  // sum of allocation sizes
  uint64_t allocations = 0;
  std::string backend;
  int device = -1;
  std::string device_uuid;
  std::string deployment;
  std::string revision;
  bool adopted = false;      // started from kept fds, not from disk
  int64_t holder_pid = 0;
  std::string socket;
  uint64_t clients = 0;      // connections that attached and are still open
  uint64_t connections = 0;  // all open connections
  // The holder's limits (holder/server.h); 0 from a holder that does not say.
  uint64_t max_connections = 0;
  uint64_t idle_timeout_ms = 0;
  // Since the holder started: attach replies sent, connections closed for
  // their idle limit, and idle ones closed to make room at max_connections.
  uint64_t attaches = 0;
  uint64_t closed_idle = 0;
  uint64_t evicted = 0;
  // The connections that said hello or attached, at most kMaxListedClients
  // of them; anonymous ones (a bare `info`) are only counted in
  // `connections`, and those past the cap in clients_unlisted. Listing every
  // connection in every reply made a thousand idle peers cost a million
  // entries, enough to stall the holder.
  std::vector<ClientEntry> client_list;
  uint64_t clients_unlisted = 0;
  // "checkpoint", or "engine" for a holder of engine-made layouts; then
  // `layouts` lists them (writing and committed), and tensors, bytes,
  // arena_bytes and allocations are their sums.
  std::string layout = "checkpoint";
  std::vector<LayoutInfo> layouts;
  // A holder of engine-made layouts: its cap on layout memory
  // (--layout-max-bytes; 0: none) and the bytes granted now, to writing
  // and committed layouts, which the cap bounds.
  uint64_t layout_max_bytes = 0;
  uint64_t layout_bytes = 0;
  // The KV pool this holder makes and serves (wsup-holder --kv-pool-mib);
  // absent from a holder without one, and from older holders.
  std::optional<KvPoolInfo> kv_pool;
};

nlohmann::json EncodeHello(const HelloMsg& m);
// With the manifest as JSON entries; the fds go to OutgoingFrame::Make.
nlohmann::json EncodeAttach(const AttachMsg& m);
// Around a manifest already encoded: ManifestToJson(), or
// ManifestHeaderToJson() with the tensor table as the binary part.
nlohmann::json EncodeAttach(nlohmann::json manifest, const Fingerprint& fingerprint,
                            const std::vector<FingerprintDiff>& diffs);
// The same for an engine-made layout: adds layout {id, hash}.
nlohmann::json EncodeLayoutAttach(nlohmann::json manifest, const Fingerprint& fingerprint, uint64_t layout_id,
                                  const std::string& layout_hash);
nlohmann::json EncodeMismatch(const MismatchMsg& m);
nlohmann::json EncodeError(const ErrorMsg& m);
nlohmann::json EncodeError(const Error& e);
nlohmann::json EncodeInfoRequest();
nlohmann::json EncodeInfo(const InfoMsg& m);
nlohmann::json EncodeBye();

Result<HelloMsg> DecodeHello(const nlohmann::json& j);
// `table` is the message's binary part (Frame::blob); `how` says how much
// of the manifest to decode and check (ManifestDecoding, wire/manifest.h).
Result<AttachMsg> DecodeAttach(const nlohmann::json& j, std::string_view table = {},
                               ManifestDecoding how = ManifestDecoding::kValidated);
Result<MismatchMsg> DecodeMismatch(const nlohmann::json& j);
Result<ErrorMsg> DecodeError(const nlohmann::json& j);
Result<InfoMsg> DecodeInfo(const nlohmann::json& j);

nlohmann::json DiffsToJson(const std::vector<FingerprintDiff>& diffs);
Result<std::vector<FingerprintDiff>> DiffsFromJson(const nlohmann::json& j);

// An `error` reply turned back into an Error (code by name, kRefused when
// unknown), prefixed with where it came from.
Error ErrorFromReply(const ErrorMsg& m, const std::string& socket_path);

// ---------------------------------------------------------------- arena record

// What a keeper stores beside the fds it keeps, and what a holder restarted
// from those fds reads (--adopt-manifest): the manifest and the fingerprint
// of the arena, so the new holder serves the same answer without the disk.
struct ArenaRecord {
  Manifest manifest;
  Fingerprint fingerprint;
};
nlohmann::json ArenaRecordToJson(const ArenaRecord& r);
Result<ArenaRecord> ArenaRecordFromJson(const nlohmann::json& j);
// Written atomically (mode 0600: it names the model and the device).
Status WriteArenaRecord(const std::string& path, const ArenaRecord& r);
Result<ArenaRecord> ReadArenaRecord(const std::string& path);

// ---------------------------------------------------------------- naming

// The holder socket for a deployment on a device: keyed by deployment name
// and device UUID (not rank), so two deployments on one host, or two ranks
// on two GPUs, never collide: "<dir>/holder-<deployment>@<uuid>.sock". Names
// are reduced to [A-Za-z0-9._-]; when that changes a name, or the path would
// not fit in sun_path, a short hash of the original names keeps the result
// unique.
std::string DefaultSocketPath(const std::string& runtime_dir, const std::string& deployment,
                              const std::string& device_uuid);

// Longest socket path that fits in sockaddr_un.sun_path (with its NUL).
size_t MaxSocketPathLength();

}  // namespace wsup
