#include "net/connection_stream.hpp"

#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

namespace metronome::net {

namespace ssl = boost::asio::ssl;

std::shared_ptr<ssl::context> make_tls_context(const std::string& cert_file,
                                               const std::string& key_file) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  // TLS 1.2 and 1.3 only; no compression (CRIME); a fresh key per
  // handshake for the ephemeral Diffie-Hellman groups.
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2
                   | ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1
                   | ssl::context::no_compression | ssl::context::single_dh_use);
  auto load = [](const std::string& what, const std::string& path, auto&& fn) {
    if (!std::filesystem::is_regular_file(path))
      throw std::runtime_error(fmt::format("TLS {} {}: no such file", what, path));
    boost::system::error_code ec;
    fn(ec);
    if (ec)
      throw std::runtime_error(fmt::format("TLS {} {}: {}", what, path, ec.message()));
  };
  load("certificate (server.tls.cert_file)", cert_file,
       [&](auto& ec) { ctx->use_certificate_chain_file(cert_file, ec); });
  load("private key (server.tls.key_file)", key_file,
       [&](auto& ec) { ctx->use_private_key_file(key_file, ssl::context::pem, ec); });
  if (SSL_CTX_check_private_key(ctx->native_handle()) != 1)
    throw std::runtime_error(fmt::format("TLS private key {} does not match the certificate {}",
                                         key_file, cert_file));
  return ctx;
}

} // namespace metronome::net
