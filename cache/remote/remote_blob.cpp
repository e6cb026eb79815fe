#include "cache/remote/remote_blob.hpp"

#include "runtime/util/hash.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>

namespace kjit::detail {
namespace {

constexpr std::string_view k_magic = "KJITRB01";
constexpr std::uint32_t k_signed = 1;
constexpr std::size_t k_mac_size = 32;

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

void put_str(std::string& out, std::string_view s) {
  put_u32(out, static_cast<std::uint32_t>(s.size()));
  out.append(s);
}

class Reader {
public:
  explicit Reader(std::string_view data) : m_data(data) {}
  bool u32(std::uint32_t& v) {
    std::uint64_t w = 0;
    if (!bytes(4, w)) {
      return false;
    }
    v = static_cast<std::uint32_t>(w);
    return true;
  }
  bool u64(std::uint64_t& v) { return bytes(8, v); }
  bool str(std::string& s) {
    std::uint32_t n = 0;
    if (!u32(n) || n > m_data.size() - m_at) {
      return false;
    }
    s.assign(m_data.substr(m_at, n));
    m_at += n;
    return true;
  }
  std::size_t at() const { return m_at; }

private:
  bool bytes(std::size_t n, std::uint64_t& v) {
    if (m_data.size() - m_at < n) {
      return false;
    }
    v = 0;
    for (std::size_t i = 0; i < n; ++i) {
      v |= std::uint64_t(static_cast<unsigned char>(m_data[m_at + i])) << (8 * i);
    }
    m_at += n;
    return true;
  }
  std::string_view m_data;
  std::size_t m_at = 0;
};

} // namespace

std::string hmac_sha256(std::string_view secret, std::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  ::HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
         reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &size);
  return std::string(reinterpret_cast<const char*>(mac), size);
}

std::string encode_remote_blob(std::string_view key, const StoredBinary& value,
                               std::string_view secret) {
  std::string out;
  out.reserve(value.blob.size() + value.log.size() + value.options.size() + 256);
  out.append(k_magic);
  put_u32(out, k_remote_format_version);
  put_u32(out, secret.empty() ? 0 : k_signed);
  put_str(out, key);
  for (const std::string* s : {&value.kind, &value.arch, &value.name, &value.nvrtc_version,
                               &value.options, &value.log, &value.blob}) {
    put_str(out, *s);
  }
  put_u64(out, static_cast<std::uint64_t>(value.driver_version));
  std::uint64_t ms_bits = 0;
  std::memcpy(&ms_bits, &value.compile_ms, sizeof ms_bits);
  put_u64(out, ms_bits);
  put_u32(out, static_cast<std::uint32_t>(value.lowered_names.size()));
  for (const auto& [expression, lowered] : value.lowered_names) {
    put_str(out, expression);
    put_str(out, lowered);
  }
  put_u64(out, checksum64(out));
  if (!secret.empty()) {
    out += hmac_sha256(secret, out);
  }
  return out;
}

std::optional<std::string> decode_remote_blob(std::string_view blob, std::string_view key,
                                              std::string_view secret, StoredBinary& out) {
  if (!blob.starts_with(k_magic)) {
    return "not a kjit entry";
  }
  Reader r(blob.substr(k_magic.size()));
  std::uint32_t format = 0;
  std::uint32_t flags = 0;
  std::string stored_key;
  if (!r.u32(format) || !r.u32(flags)) {
    return "truncated";
  }
  if (format != k_remote_format_version) {
    return "another entry format";
  }
  const bool is_signed = (flags & k_signed) != 0;
  if (!secret.empty() && !is_signed) {
    return "unsigned (a fleet secret is set)";
  }
  StoredBinary v;
  std::uint64_t driver = 0;
  std::uint64_t ms_bits = 0;
  std::uint32_t count = 0;
  bool ok = r.str(stored_key);
  for (std::string* s :
       {&v.kind, &v.arch, &v.name, &v.nvrtc_version, &v.options, &v.log, &v.blob}) {
    ok = ok && r.str(*s);
  }
  ok = ok && r.u64(driver) && r.u64(ms_bits) && r.u32(count);
  for (std::uint32_t i = 0; ok && i < count; ++i) {
    std::string expression;
    std::string lowered;
    ok = r.str(expression) && r.str(lowered);
    v.lowered_names.emplace_back(std::move(expression), std::move(lowered));
  }
  const std::size_t body = k_magic.size() + r.at();
  std::uint64_t checksum = 0;
  ok = ok && r.u64(checksum);
  if (!ok) {
    return "truncated";
  }
  const std::size_t end = k_magic.size() + r.at();
  const std::size_t expected_size = end + (is_signed ? k_mac_size : 0);
  if (blob.size() != expected_size) {
    return blob.size() < expected_size ? "truncated" : "trailing bytes";
  }
  if (checksum != checksum64(blob.substr(0, body))) {
    return "checksum mismatch";
  }
  if (stored_key != key) {
    return "holds another key";
  }
  if (!secret.empty()) {
    const std::string mac = hmac_sha256(secret, blob.substr(0, end));
    if (CRYPTO_memcmp(mac.data(), blob.data() + end, k_mac_size) != 0) {
      return "wrong signature";
    }
  }
  std::memcpy(&v.compile_ms, &ms_bits, sizeof ms_bits);
  v.driver_version = static_cast<std::int64_t>(driver);
  out = std::move(v);
  return std::nullopt;
}

} // namespace kjit::detail
