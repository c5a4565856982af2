#include "wire/protocol.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/enum_names.h"
#include "common/fs.h"
#include "common/sha256.h"
#include "wire/message_fields.h"

namespace wsup {

using nlohmann::json;
using namespace wsup::fields;

namespace {

constexpr size_t kReadChunk = 64 << 10;
constexpr uint64_t kMaxAnnouncedFds = 1 << 16;


// Milliseconds left until a deadline, never negative.
int MsLeft(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

}  // namespace

constexpr EnumNames<ClientRole::kInspect> kClientRoleNames{"engine", "keeper", "inspect"};

const char* ClientRoleName(ClientRole role) { return kClientRoleNames(role, "unknown"); }

Result<ClientRole> ParseClientRole(std::string_view name) {
  if (auto role = kClientRoleNames.Parse(name)) return *role;
  return InvalidArgument("client role '" + std::string(name.substr(0, 64)) +
                         "' is not one of engine, keeper, inspect");
}

// ---------------------------------------------------------------- framing

std::string Frame::type() const {
  if (!msg.is_object()) return "";
  auto it = msg.find("type");
  return it != msg.end() && it->is_string() ? it->get<std::string>() : "";
}

Result<json> ParseMessageBody(std::string_view body, const std::string& what) {
  FrameDialect d;
  d.body = what + ": message";
  return ParseFrameBody(body, d);
}

Result<OutgoingFrame> OutgoingFrame::Make(json msg, std::vector<UniqueFd> fds, uint32_t max_bytes,
                                          std::shared_ptr<const std::string> blob) {
  if (!fds.empty()) msg["fds"] = fds.size();
  if (blob && blob->empty()) blob.reset();
  if (blob) {
    if (blob->size() > kMaxBlobBytes) {
      return InvalidArgument("a binary part of " + std::to_string(blob->size()) + " bytes exceeds the " +
                             std::to_string(kMaxBlobBytes) +
                             "-byte limit; the tensor table is too large to send: use fewer, larger tensors");
    }
    msg["blob"] = blob->size();
  }
  OutgoingFrame f;
  WSUP_ASSIGN_OR_RETURN(f.bytes_, EncodeFrame(msg, max_bytes));
  if (blob) {
    auto n = static_cast<uint32_t>(blob->size());
    for (int i = 0; i < 4; ++i) f.bytes_.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    f.blob_ = std::move(blob);
  }
  size_t chunks = (fds.size() + kMaxFdsPerSend - 1) / kMaxFdsPerSend;
  if (chunks > f.bytes_.size()) {
    return Internal("a message of " + std::to_string(f.bytes_.size()) + " bytes cannot carry " +
                    std::to_string(fds.size()) + " fds (each batch of " + std::to_string(kMaxFdsPerSend) +
                    " needs a byte of its own)");
  }
  f.fds_ = std::move(fds);
  return f;
}

OutgoingFrame OutgoingFrame::Bytes(std::string bytes) {
  OutgoingFrame f;
  f.bytes_ = std::move(bytes);
  return f;
}

Result<bool> OutgoingFrame::SendSome(int sock) {
  while (!done()) {
    size_t fds_left = fds_.size() - fds_sent_;
    size_t batch = std::min(fds_left, kMaxFdsPerSend);
    // Every batch of fds rides on its own byte of the message (Make() made
    // sure there are enough); all the other bytes go with the last.
    iovec iov[2];
    size_t iovs = 0;
    if (sent_ < bytes_.size()) {
      size_t len = fds_left > batch ? 1 : bytes_.size() - sent_;
      iov[iovs++] = {const_cast<char*>(bytes_.data() + sent_), len};
      if (fds_left <= batch && blob_bytes() > 0)
        iov[iovs++] = {const_cast<char*>(blob_->data()), blob_bytes()};
    } else {
      size_t at = sent_ - bytes_.size();
      iov[iovs++] = {const_cast<char*>(blob_->data() + at), blob_bytes() - at};
    }
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = iovs;
    std::vector<char> control;
    if (batch > 0) {
      control.assign(CMSG_SPACE(sizeof(int) * batch), 0);
      mh.msg_control = control.data();
      mh.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&mh);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * batch);
      auto* out = reinterpret_cast<int*>(CMSG_DATA(c));
      for (size_t i = 0; i < batch; ++i) out[i] = fds_[fds_sent_ + i].get();
    }
    ssize_t n = ::sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      return ErrnoError("sending a message", errno);
    }
    if (n == 0) return false;
    for (size_t i = 0; i < batch; ++i) fds_[fds_sent_ + i].Reset();
    fds_sent_ += batch;
    sent_ += static_cast<size_t>(n);
  }
  return true;
}

Result<FrameReader::ReadState> FrameReader::ReadSome(int sock, size_t budget) {
  char buf[kReadChunk];
  size_t want = std::min(budget, sizeof(buf));
  if (want == 0) return ReadState::kWouldBlock;
  iovec iov{buf, want};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];
  if (accept_fds_) {
    mh.msg_control = control;
    mh.msg_controllen = sizeof(control);
  }
  ssize_t n;
  do {
    n = ::recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ReadState::kWouldBlock;
    if (errno == ECONNRESET) return ReadState::kEof;
    return ErrnoError("reading a holder protocol message", errno);
  }
  if (accept_fds_) {
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const auto* in = reinterpret_cast<const int*>(CMSG_DATA(c));
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, in + i, sizeof(fd));
        fds_.emplace_back(fd);
      }
    }
    if (mh.msg_flags & MSG_CTRUNC) {
      return IoError("file descriptors sent by the peer were cut off (MSG_CTRUNC); raise the open-file "
                     "limit (ulimit -n) of this process");
    }
  }
  if (n == 0) return ReadState::kEof;
  WSUP_RETURN_IF_ERROR(decoder_.Feed(buf, static_cast<size_t>(n)));
  return ReadState::kData;
}

Result<std::optional<Frame>> FrameReader::Next() {
  WSUP_ASSIGN_OR_RETURN(auto msg, decoder_.NextMessage());
  if (!msg) return std::optional<Frame>();
  Frame f;
  f.msg = std::move(msg->msg);
  f.blob = std::move(msg->blob);
  uint64_t want = 0;
  auto it = f.msg.find("fds");
  if (it != f.msg.end()) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() > kMaxAnnouncedFds) {
      return Corrupt("message field 'fds' is not a count of file descriptors; the peer does not speak the "
                     "holder protocol");
    }
    want = it->get<uint64_t>();
  }
  if (want > 0 && !accept_fds_) {
    return Corrupt("message announces " + std::to_string(want) +
                   " file descriptors but this side accepts none; only the holder sends fds");
  }
  if (fds_.size() < want) {
    return Corrupt("message announces " + std::to_string(want) + " file descriptors but " +
                   std::to_string(fds_.size()) +
                   " arrived; they were lost on the way (open-file limit?): raise ulimit -n and retry");
  }
  for (uint64_t i = 0; i < want; ++i) {
    f.fds.push_back(std::move(fds_.front()));
    fds_.pop_front();
  }
  return std::optional<Frame>(std::move(f));
}

// ---------------------------------------------------------------- channel

size_t MaxSocketPathLength() { return sizeof(sockaddr_un::sun_path) - 1; }

Result<Channel> Channel::Connect(const std::string& socket_path, int timeout_ms, SocketPeer peer) {
  if (socket_path.empty()) {
    return InvalidArgument("no socket path given for " + peer.name + "; pass the path it listens on");
  }
  if (socket_path.size() > MaxSocketPathLength()) {
    return InvalidArgument(socket_path + ": socket path is " + std::to_string(socket_path.size()) +
                           " bytes, longer than the " + std::to_string(MaxSocketPathLength()) +
                           " a Unix socket allows; use a shorter runtime directory");
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError(socket_path + ": cannot create a socket", errno);
  // A full backlog makes connect() wait; bound that wait like every other.
  timeval tv{};
  tv.tv_sec = timeout_ms / 1000;
  tv.tv_usec = static_cast<suseconds_t>(timeout_ms % 1000) * 1000;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int e = errno;
    if (e == ENOENT || e == ECONNREFUSED || e == ENOTDIR) {
      return Unavailable(socket_path + ": " + peer.name + " is not listening there (" + std::strerror(e) +
                         "); " + peer.start + ", or check the path");
    }
    if (e == EACCES || e == EPERM) {
      return Refused(socket_path + ": permission denied; the socket is private to the user that runs " +
                     peer.name + ": connect as that user");
    }
    if (e == EAGAIN || e == EWOULDBLOCK || e == EINPROGRESS) {
      return Timeout(socket_path + ": " + peer.name + " did not accept the connection within " +
                     std::to_string(timeout_ms) + " ms; it is overloaded or hung: check its log");
    }
    return ErrnoError(socket_path + ": cannot connect to " + peer.name, e);
  }
  Channel ch;
  ch.fd_ = std::move(fd);
  ch.path_ = socket_path;
  ch.peer_ = std::move(peer.name);
  return ch;
}

Status Channel::Send(const json& msg, std::vector<UniqueFd> fds, int timeout_ms,
                     std::shared_ptr<const std::string> blob) {
  if (!fd_.valid()) return Internal(path_ + ": send on a closed channel");
  WSUP_ASSIGN_OR_RETURN(auto frame, OutgoingFrame::Make(msg, std::move(fds), kMaxMessageBytes, std::move(blob)));
  return SendFrame(std::move(frame), timeout_ms);
}

Status Channel::SendBytes(std::string bytes, int timeout_ms) {
  if (!fd_.valid()) return Internal(path_ + ": send on a closed channel");
  return SendFrame(OutgoingFrame::Bytes(std::move(bytes)), timeout_ms);
}

Status Channel::SendFrame(OutgoingFrame frame, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto sent = frame.SendSome(fd_.get());
    if (!sent.ok()) {
      return Error(sent.error().code(), path_ + ": cannot send to " + peer_ + " (" + sent.error().message() +
                                            "); it may have exited or closed this connection: check its log");
    }
    if (*sent) return Status::Ok();
    pollfd p{fd_.get(), POLLOUT, 0};
    int left = MsLeft(deadline);
    int rc = ::poll(&p, 1, left);
    if (rc < 0 && errno != EINTR) return ErrnoError(path_ + ": poll", errno);
    if (rc == 0) {
      return Timeout(path_ + ": " + peer_ + " did not take a message within " + std::to_string(timeout_ms) +
                     " ms; it is overloaded or hung: check its log");
    }
  }
}

Result<Frame> Channel::Receive(int timeout_ms) {
  if (!fd_.valid()) return Internal(path_ + ": receive on a closed channel");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto next = reader_.Next();
    if (!next.ok()) return next.error().With(path_);
    if (next->has_value()) return std::move(**next);
    auto state = reader_.ReadSome(fd_.get(), kReadChunk);
    if (!state.ok()) return state.error().With(path_);
    if (*state == FrameReader::ReadState::kData) continue;
    if (*state == FrameReader::ReadState::kEof) {
      return Unavailable(path_ + ": " + peer_ + " closed the connection" +
                         std::string(reader_.mid_message() ? " in the middle of a message" : "") +
                         "; it may have exited or refused this client: check its log");
    }
    pollfd p{fd_.get(), POLLIN, 0};
    int rc = ::poll(&p, 1, MsLeft(deadline));
    if (rc < 0 && errno != EINTR) return ErrnoError(path_ + ": poll", errno);
    if (rc == 0) {
      return Timeout(path_ + ": no reply from " + peer_ + " within " + std::to_string(timeout_ms) +
                     " ms; it is overloaded or hung: check its log");
    }
  }
}

Result<Frame> Channel::Call(const json& msg, int timeout_ms, std::shared_ptr<const std::string> blob) {
  Status sent = Send(msg, {}, timeout_ms, std::move(blob));
  if (!sent.ok()) {
    // A holder that turns a connection away (its connection limit, another
    // uid) writes why and closes without reading, so the request may meet a
    // closed socket (EPIPE) while the reason already waits in ours: return
    // the reason. Receive(0) takes only what has arrived.
    if (sent.code() == Code::kIo && fd_.valid()) {
      auto why = Receive(0);
      if (why.ok()) return why;
    }
    return sent.error();
  }
  return Receive(timeout_ms);
}

// ---------------------------------------------------------------- messages

json DiffsToJson(const std::vector<FingerprintDiff>& diffs) {
  json a = json::array();
  for (const auto& d : diffs) a.push_back({{"field", d.field}, {"ours", d.ours}, {"holder", d.theirs}});
  return a;
}

Result<std::vector<FingerprintDiff>> DiffsFromJson(const json& j) {
  if (!j.is_array()) return FieldError("mismatch", "diffs", "an array");
  std::vector<FingerprintDiff> out;
  for (const auto& d : j) {
    if (!d.is_object()) return FieldError("mismatch", "diffs[]", "an object");
    FingerprintDiff diff;
    WSUP_ASSIGN_OR_RETURN(diff.field, GetString(d, "mismatch", "field"));
    WSUP_ASSIGN_OR_RETURN(diff.ours, GetString(d, "mismatch", "ours"));
    WSUP_ASSIGN_OR_RETURN(diff.theirs, GetString(d, "mismatch", "holder"));
    out.push_back(std::move(diff));
  }
  return out;
}

json EncodeHello(const HelloMsg& m) {
  json j = {{"type", "hello"}, {"version", m.version}, {"client", m.client}, {"role", ClientRoleName(m.role)}};
  if (m.fingerprint) j["fingerprint"] = m.fingerprint->ToJson();
  if (m.tensor_table > 0) j["tensor_table"] = m.tensor_table;
  if (m.publish) j["publish"] = true;
  if (m.wait_ms > 0) j["wait_ms"] = m.wait_ms;
  return j;
}

json EncodeAttach(json manifest, const Fingerprint& fingerprint, const std::vector<FingerprintDiff>& diffs) {
  return {{"type", "attach"},
          {"manifest", std::move(manifest)},
          {"fingerprint", fingerprint.ToJson()},
          {"diffs", DiffsToJson(diffs)}};
}

json EncodeAttach(const AttachMsg& m) {
  if (m.layout_id != 0) return EncodeLayoutAttach(ManifestToJson(m.manifest), m.fingerprint, m.layout_id, m.layout_hash);
  return EncodeAttach(ManifestToJson(m.manifest), m.fingerprint, m.diffs);
}

json EncodeLayoutAttach(json manifest, const Fingerprint& fingerprint, uint64_t layout_id,
                        const std::string& layout_hash) {
  json j = EncodeAttach(std::move(manifest), fingerprint, {});
  j["layout"] = {{"id", layout_id}, {"hash", layout_hash}};
  return j;
}

json EncodeMismatch(const MismatchMsg& m) {
  return {{"type", "mismatch"}, {"diffs", DiffsToJson(m.diffs)}, {"message", m.message}};
}

json EncodeError(const ErrorMsg& m) { return {{"type", "error"}, {"code", m.code}, {"message", m.message}}; }

json EncodeError(const Error& e) { return EncodeError(ErrorMsg{CodeName(e.code()), e.message()}); }

json EncodeInfoRequest() { return {{"type", "info"}}; }

json EncodeInfo(const InfoMsg& m) {
  json layouts = json::array();
  for (const auto& l : m.layouts) layouts.push_back(LayoutInfoToJson(l));
  json clients = json::array();
  for (const auto& c : m.client_list) {
    clients.push_back(
        {{"name", c.name}, {"role", c.role}, {"pid", c.pid}, {"uid", c.uid}, {"attached", c.attached}});
  }
  json j = {{"type", "info"},
            {"fingerprint", m.fingerprint.ToJson()},
            {"tensors", m.tensors},
            {"bytes", m.bytes},
            {"arena_bytes", m.arena_bytes},
            {"allocations", m.allocations},
            {"backend", m.backend},
            {"device", m.device},
            {"device_uuid", m.device_uuid},
            {"deployment", m.deployment},
            {"revision", m.revision},
            {"adopted", m.adopted},
            {"holder_pid", m.holder_pid},
            {"socket", m.socket},
            {"clients", m.clients},
            {"connections", m.connections},
            {"max_connections", m.max_connections},
            {"idle_timeout_ms", m.idle_timeout_ms},
            {"attaches", m.attaches},
            {"closed_idle", m.closed_idle},
            {"evicted", m.evicted},
            {"client_list", clients},
            {"clients_unlisted", m.clients_unlisted},
            {"layout", m.layout},
            {"layouts", layouts},
            {"layout_max_bytes", m.layout_max_bytes},
            {"layout_bytes", m.layout_bytes}};
  if (m.kv_pool) {
    j["kv_pool"] = {{"id", m.kv_pool->id},
                    {"bytes", m.kv_pool->bytes},
                    {"allocations", m.kv_pool->allocations},
                    {"adopted", m.kv_pool->adopted}};
  }
  return j;
}

json EncodeBye() { return {{"type", "bye"}}; }

Result<HelloMsg> DecodeHello(const json& j) {
  HelloMsg m;
  WSUP_ASSIGN_OR_RETURN(int64_t version, GetI64(j, "hello", "version"));
  if (version < 0 || version > 1'000'000) return FieldError("hello", "version", "a protocol version");
  m.version = static_cast<int>(version);
  WSUP_ASSIGN_OR_RETURN(m.client, GetString(j, "hello", "client"));
  if (m.client.size() > kMaxClientNameBytes || HasControlChars(m.client)) {
    return Corrupt("'hello' message: client name is longer than " + std::to_string(kMaxClientNameBytes) +
                   " bytes or holds control characters; give the client a short printable name");
  }
  WSUP_ASSIGN_OR_RETURN(std::string role, GetString(j, "hello", "role"));
  auto parsed_role = ParseClientRole(role);
  if (!parsed_role.ok()) return Corrupt("'hello' message: " + parsed_role.error().message());
  m.role = *parsed_role;
  if (j.contains("fingerprint") && !j["fingerprint"].is_null()) {
    WSUP_ASSIGN_OR_RETURN(m.fingerprint, GetFingerprint(j, "hello", "fingerprint"));
  }
  if (j.contains("tensor_table")) {
    WSUP_ASSIGN_OR_RETURN(uint64_t table, GetU64(j, "hello", "tensor_table"));
    if (table > 1'000'000) return FieldError("hello", "tensor_table", "a tensor table version");
    m.tensor_table = static_cast<uint32_t>(table);
  }
  if (j.contains("publish")) {
    WSUP_ASSIGN_OR_RETURN(m.publish, GetBool(j, "hello", "publish"));
  }
  if (j.contains("wait_ms")) {
    WSUP_ASSIGN_OR_RETURN(m.wait_ms, GetU64(j, "hello", "wait_ms"));
    if (m.wait_ms > kMaxLayoutWaitMs) {
      return Corrupt("'hello' message: field 'wait_ms' = " + std::to_string(m.wait_ms) + " is more than the " +
                     std::to_string(kMaxLayoutWaitMs) + " ms (an hour) a client may wait for another's commit");
    }
  }
  return m;
}

Result<AttachMsg> DecodeAttach(const json& j, std::string_view table, ManifestDecoding how) {
  AttachMsg m;
  auto it = j.find("manifest");
  if (it == j.end() || !it->is_object()) return FieldError("attach", "manifest", "an object");
  try {
    auto manifest = ManifestFromJson(*it, table, how);
    if (!manifest.ok()) return manifest.error().With("'attach' message: manifest");
    m.manifest = std::move(manifest).value();
  } catch (const std::exception& e) {
    return Corrupt(std::string("'attach' message: manifest: ") + e.what());
  }
  WSUP_ASSIGN_OR_RETURN(m.fingerprint, GetFingerprint(j, "attach", "fingerprint"));
  if (j.contains("diffs")) {
    WSUP_ASSIGN_OR_RETURN(m.diffs, DiffsFromJson(j["diffs"]));
  }
  if (j.contains("layout")) {
    const json& l = j["layout"];
    if (!l.is_object()) return FieldError("attach", "layout", "an object");
    WSUP_ASSIGN_OR_RETURN(m.layout_id, GetU64(l, "attach layout", "id"));
    WSUP_ASSIGN_OR_RETURN(m.layout_hash, GetString(l, "attach layout", "hash"));
    if (m.layout_id == 0) return FieldError("attach layout", "id", "a layout id (1 or more)");
  }
  return m;
}

Result<MismatchMsg> DecodeMismatch(const json& j) {
  MismatchMsg m;
  auto it = j.find("diffs");
  if (it == j.end()) return FieldError("mismatch", "diffs", "an array");
  WSUP_ASSIGN_OR_RETURN(m.diffs, DiffsFromJson(*it));
  m.message = GetStringOr(j, "message", "");
  return m;
}

Result<ErrorMsg> DecodeError(const json& j) {
  ErrorMsg m;
  WSUP_ASSIGN_OR_RETURN(m.message, GetString(j, "error", "message"));
  m.code = GetStringOr(j, "code", "refused");
  return m;
}

Result<InfoMsg> DecodeInfo(const json& j) {
  InfoMsg m;
  WSUP_ASSIGN_OR_RETURN(m.fingerprint, GetFingerprint(j, "info", "fingerprint"));
  WSUP_ASSIGN_OR_RETURN(m.tensors, GetU64(j, "info", "tensors"));
  WSUP_ASSIGN_OR_RETURN(m.bytes, GetU64(j, "info", "bytes"));
  WSUP_ASSIGN_OR_RETURN(m.arena_bytes, GetU64(j, "info", "arena_bytes"));
  WSUP_ASSIGN_OR_RETURN(m.allocations, GetU64(j, "info", "allocations"));
  WSUP_ASSIGN_OR_RETURN(m.backend, GetString(j, "info", "backend"));
  WSUP_ASSIGN_OR_RETURN(int64_t device, GetI64(j, "info", "device"));
  m.device = static_cast<int>(device);
  m.device_uuid = GetStringOr(j, "device_uuid", "");
  m.deployment = GetStringOr(j, "deployment", "");
  m.revision = GetStringOr(j, "revision", "");
  WSUP_ASSIGN_OR_RETURN(m.adopted, GetBool(j, "info", "adopted"));
  WSUP_ASSIGN_OR_RETURN(m.holder_pid, GetI64(j, "info", "holder_pid"));
  m.socket = GetStringOr(j, "socket", "");
  WSUP_ASSIGN_OR_RETURN(m.clients, GetU64(j, "info", "clients"));
  WSUP_ASSIGN_OR_RETURN(m.connections, GetU64(j, "info", "connections"));
  WSUP_ASSIGN_OR_RETURN(m.max_connections, GetU64Or(j, "info", "max_connections", 0));
  WSUP_ASSIGN_OR_RETURN(m.idle_timeout_ms, GetU64Or(j, "info", "idle_timeout_ms", 0));
  WSUP_ASSIGN_OR_RETURN(m.attaches, GetU64Or(j, "info", "attaches", 0));
  WSUP_ASSIGN_OR_RETURN(m.closed_idle, GetU64Or(j, "info", "closed_idle", 0));
  WSUP_ASSIGN_OR_RETURN(m.evicted, GetU64Or(j, "info", "evicted", 0));
  WSUP_ASSIGN_OR_RETURN(m.clients_unlisted, GetU64Or(j, "info", "clients_unlisted", 0));
  auto it = j.find("client_list");
  if (it == j.end() || !it->is_array()) return FieldError("info", "client_list", "an array");
  for (const auto& c : *it) {
    if (!c.is_object()) return FieldError("info", "client_list[]", "an object");
    ClientEntry e;
    WSUP_ASSIGN_OR_RETURN(e.name, GetString(c, "info client_list[]", "name"));
    WSUP_ASSIGN_OR_RETURN(e.role, GetString(c, "info client_list[]", "role"));
    WSUP_ASSIGN_OR_RETURN(e.pid, GetI64(c, "info client_list[]", "pid"));
    WSUP_ASSIGN_OR_RETURN(e.uid, GetI64(c, "info client_list[]", "uid"));
    WSUP_ASSIGN_OR_RETURN(e.attached, GetBool(c, "info client_list[]", "attached"));
    m.client_list.push_back(std::move(e));
  }
  m.layout = GetStringOr(j, "layout", "checkpoint");
  if (m.layout != "checkpoint" && m.layout != "engine") {
    return FieldError("info", "layout", "checkpoint or engine");
  }
  if (j.contains("layouts")) {
    const json& ls = j["layouts"];
    if (!ls.is_array()) return FieldError("info", "layouts", "an array");
    for (const auto& l : ls) {
      WSUP_ASSIGN_OR_RETURN(LayoutInfo info, LayoutInfoFromJson(l));
      m.layouts.push_back(std::move(info));
    }
  }
  WSUP_ASSIGN_OR_RETURN(m.layout_max_bytes, GetU64Or(j, "info", "layout_max_bytes", 0));
  WSUP_ASSIGN_OR_RETURN(m.layout_bytes, GetU64Or(j, "info", "layout_bytes", 0));
  // Absent: no pool (or a holder from before pools).
  if (j.contains("kv_pool") && !j["kv_pool"].is_null()) {
    const json& p = j["kv_pool"];
    if (!p.is_object()) return FieldError("info", "kv_pool", "an object");
    KvPoolInfo k;
    WSUP_ASSIGN_OR_RETURN(k.id, GetString(p, "info kv_pool", "id"));
    if (k.id.size() > 64 || HasControlChars(k.id)) return FieldError("info kv_pool", "id", "a pool id");
    WSUP_ASSIGN_OR_RETURN(k.bytes, GetU64(p, "info kv_pool", "bytes"));
    WSUP_ASSIGN_OR_RETURN(k.allocations, GetU64(p, "info kv_pool", "allocations"));
    if (p.contains("adopted")) {
      WSUP_ASSIGN_OR_RETURN(k.adopted, GetBool(p, "info kv_pool", "adopted"));
    }
    m.kv_pool = std::move(k);
  }
  return m;
}

Error ErrorFromReply(const ErrorMsg& m, const std::string& socket_path) {
  Code code = Code::kRefused;
  for (Code c : {Code::kInvalidArgument, Code::kNotFound, Code::kIo, Code::kCorrupt, Code::kRefused,
                 Code::kMismatch, Code::kTimeout, Code::kUnavailable, Code::kInternal}) {
    if (m.code == CodeName(c)) code = c;
  }
  return Error(code, socket_path + ": the holder answered: " + m.message);
}

// ---------------------------------------------------------------- arena record

json ArenaRecordToJson(const ArenaRecord& r) {
  return {{"format", "wsup-arena-record"},
          {"version", 1},
          {"manifest", ManifestToJson(r.manifest)},
          {"fingerprint", r.fingerprint.ToJson()}};
}

Result<ArenaRecord> ArenaRecordFromJson(const json& j) {
  if (!j.is_object() || GetStringOr(j, "format", "") != "wsup-arena-record") {
    return Corrupt("not a wsup arena record (no \"format\": \"wsup-arena-record\"); pass the file a keeper "
                   "wrote with the arena's manifest and fingerprint");
  }
  ArenaRecord r;
  auto it = j.find("manifest");
  if (it == j.end() || !it->is_object()) return FieldError("arena record", "manifest", "an object");
  try {
    auto manifest = ManifestFromJson(*it);
    if (!manifest.ok()) return manifest.error().With("manifest");
    r.manifest = std::move(manifest).value();
  } catch (const std::exception& e) {
    return Corrupt(std::string("manifest: ") + e.what());
  }
  WSUP_ASSIGN_OR_RETURN(r.fingerprint, GetFingerprint(j, "arena record", "fingerprint"));
  return r;
}

Status WriteArenaRecord(const std::string& path, const ArenaRecord& r) {
  std::string text;
  try {
    text = ArenaRecordToJson(r).dump(1, ' ', false, json::error_handler_t::replace);
  } catch (const std::exception& e) {
    return Internal(path + ": cannot serialize the arena record: " + e.what());
  }
  return WriteFileAtomic(path, text + "\n", 0600);
}

Result<ArenaRecord> ReadArenaRecord(const std::string& path) {
  WSUP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, 256u << 20));
  auto j = ParseMessageBody(text, path);
  if (!j.ok()) return j.error();
  auto r = ArenaRecordFromJson(*j);
  if (!r.ok()) return r.error().With(path);
  return r;
}

// ---------------------------------------------------------------- naming

namespace {

std::string Sanitize(const std::string& s, bool* changed) {
  std::string out;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-';
    out.push_back(ok ? c : '_');
    if (!ok) *changed = true;
  }
  if (out.empty() || out == "." || out == "..") {
    out = "_" + out;
    *changed = true;
  }
  return out;
}

}  // namespace

std::string DefaultSocketPath(const std::string& runtime_dir, const std::string& deployment,
                              const std::string& device_uuid) {
  bool changed = false;
  // '@' never survives Sanitize(), so it separates the two names unambiguously.
  std::string name = "holder-" + Sanitize(deployment, &changed) + "@" + Sanitize(device_uuid, &changed);
  // Length-prefixed so ("a-b", "c") and ("a", "b-c") hash apart.
  std::string key = std::to_string(deployment.size()) + ":" + deployment + "/" + device_uuid;
  std::string hash = Sha256Hex(key).substr(0, 16);
  if (changed) name += "-" + hash;
  std::string path = JoinPath(runtime_dir, name + ".sock");
  if (path.size() > MaxSocketPathLength()) path = JoinPath(runtime_dir, "holder-" + hash + ".sock");
  return path;
}

}  // namespace wsup
