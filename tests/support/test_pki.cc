#include "test_pki.h"

#include <vector>

#include "subprocess.h"

namespace ddp::testing {

const TestPki& test_pki() {
  using namespace std::chrono_literals;
  static const TestPki pki = [] {
    TestPki p;
    auto version = run_process({"openssl", "version"}, {}, 10s);
    if (!version.exited || version.code != 0) {
      p.error = "the openssl command is not installed: cannot make test certificates";
      return p;
    }
    p.dir = make_temp_dir();
    p.ca = p.dir + "/ca.pem";
    p.cert = p.dir + "/server.pem";
    p.key = p.dir + "/server.key";
    p.other_ca = p.dir + "/other-ca.pem";
    const std::string ca_key = p.dir + "/ca.key", csr = p.dir + "/server.csr",
                      ext = p.dir + "/ext.cnf";
    write_file(ext,
               "basicConstraints=CA:FALSE\n"
               "keyUsage=digitalSignature,keyEncipherment\n"
               "extendedKeyUsage=serverAuth\n"
               "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
    const std::vector<std::vector<std::string>> steps = {
        {"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", ca_key, "-out", p.ca, "-days", "2", "-subj", "/CN=ddprun test CA"},
        {"openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", p.key, "-out", csr, "-subj", "/CN=localhost"},
        {"openssl", "x509", "-req", "-in", csr, "-CA", p.ca, "-CAkey", ca_key, "-CAcreateserial",
         "-out", p.cert, "-days", "2", "-extfile", ext},
        {"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", p.dir + "/other-ca.key", "-out", p.other_ca, "-days", "2", "-subj",
         "/CN=other CA"},
    };
    for (const auto& argv : steps) {
      auto r = run_process(argv, {}, 30s);
      if (!r.exited || r.code != 0) {
        p.error = "'" + argv[0] + " " + argv[1] + "' failed (exit " + std::to_string(r.code) +
                  "): " + r.err;
        break;
      }
    }
    return p;
  }();
  return pki;
}

}  // namespace ddp::testing
