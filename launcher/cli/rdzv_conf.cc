#include "cli/rdzv_conf.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>

#include "ddp/common/error.h"

namespace ddp::launcher {

RdzvConf parse_rdzv_conf(const std::string& text, std::vector<std::string>* notices) {
  auto notice = [&](const std::string& line) {
    if (notices != nullptr) notices->push_back(line);
  };
  RdzvConf conf;
  double close_timeout = 0, keep_alive_attempts = 0;  // 0: not given (both must be > 0)
  bool heartbeat_timeout_given = false;
  // Durations in seconds (> 0, the last call may be 0) and sizes in bytes/counts (>= 1).
  const std::map<std::string, double*> seconds = {
      {"join_timeout", &conf.join_timeout_s},
      {"timeout", &conf.join_timeout_s},  // torchrun's name
      {"last_call_timeout", &conf.last_call_timeout_s},
      {"heartbeat_interval", &conf.heartbeat_interval_s},
      {"keep_alive_interval", &conf.heartbeat_interval_s},  // torchrun's name
      {"heartbeat_timeout", &conf.heartbeat_timeout_s},
      {"read_timeout", &conf.read_timeout_s},
      {"close_timeout", &close_timeout}};
  const std::map<std::string, long long*> sizes = {{"max_key_bytes", &conf.max_key_bytes},
                                                   {"max_value_bytes", &conf.max_value_bytes},
                                                   {"max_keys", &conf.max_keys},
                                                   {"max_store_bytes", &conf.max_store_bytes},
                                                   {"max_pending_waits", &conf.max_pending_waits},
                                                   {"max_message_bytes", &conf.max_message_bytes}};
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) throw Error("--rdzv_conf: '" + item + "' is not key=value");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "use_libuv" || key == "store_type") {
      notice("--rdzv_conf " + key + "=" + value +
             " has no effect: ddprun's rendezvous is its own gRPC server");
      continue;
    }
    if (!seconds.count(key) && !sizes.count(key) && key != "is_host" &&
        key != "keep_alive_max_attempt") {
      // torchrun hands unknown keys to custom backends and ignores them otherwise.
      notice("--rdzv_conf " + key + "=" + value +
             " has no effect: not a key ddprun knows (join_timeout or timeout, last_call_timeout, "
             "close_timeout, read_timeout, is_host, heartbeat_interval or keep_alive_interval, "
             "heartbeat_timeout, keep_alive_max_attempt, max_key_bytes, max_value_bytes, max_keys, "
             "max_store_bytes, max_pending_waits, max_message_bytes)");
      continue;
    }
    if (key == "is_host") {
      // torchrun's spellings of a boolean.
      std::string v = value;
      std::transform(v.begin(), v.end(), v.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      if (v == "1" || v == "true" || v == "t" || v == "yes" || v == "y" || v == "on") {
        conf.is_host = true;
      } else if (v == "0" || v == "false" || v == "f" || v == "no" || v == "n" || v == "off") {
        conf.is_host = false;
      } else {
        throw Error("--rdzv_conf: is_host=" + value + " is not a boolean (1/0, true/false)");
      }
      continue;
    }
    double number = 0;
    try {
      size_t used = 0;
      number = std::stod(value, &used);
      if (used != value.size()) throw std::invalid_argument(value);
    } catch (const std::exception&) {
      throw Error("--rdzv_conf: " + key + "=" + value + " is not a number");
    }
    if (key == "keep_alive_max_attempt") {
      if (!(number >= 1 && number <= 1000000) || number != static_cast<long long>(number)) {
        throw Error("--rdzv_conf: keep_alive_max_attempt=" + value +
                    " must be a whole number >= 1");
      }
      keep_alive_attempts = number;
    } else if (auto it = seconds.find(key); it != seconds.end()) {
      bool may_be_zero = key == "last_call_timeout";
      if (!(number >= 0) || (!may_be_zero && number == 0) || number > 365 * 86400.0) {
        throw Error("--rdzv_conf: " + key + "=" + value + " is out of range (seconds)");
      }
      *it->second = number;
      if (key == "heartbeat_timeout") heartbeat_timeout_given = true;
    } else if (auto sz = sizes.find(key); sz != sizes.end()) {
      if (!(number >= 1) || number > 1024.0 * 1024 * 1024 ||
          number != static_cast<long long>(number)) {
        throw Error("--rdzv_conf: " + key + "=" + value + " must be a whole number in [1, 2^30]");
      }
      *sz->second = static_cast<long long>(number);
    }
  }
  if (close_timeout > 0) conf.close_timeout_s = close_timeout;
  if (keep_alive_attempts > 0) {
    if (heartbeat_timeout_given) {
      notice(
          "--rdzv_conf keep_alive_max_attempt has no effect: heartbeat_timeout is given and sets "
          "when a "
          "silent node is declared gone");
    } else {
      conf.heartbeat_timeout_s = conf.heartbeat_interval_s * keep_alive_attempts;
    }
  }
  if (!heartbeat_timeout_given && keep_alive_attempts == 0 &&
      conf.heartbeat_interval_s >= conf.heartbeat_timeout_s) {
    conf.heartbeat_timeout_s =
        conf.heartbeat_interval_s * 3;  // torchrun's keep_alive_max_attempt default
  }
  if (conf.heartbeat_interval_s >= conf.heartbeat_timeout_s) {
    throw Error("--rdzv_conf: heartbeat_interval must be shorter than heartbeat_timeout");
  }
  if (conf.max_value_bytes + conf.max_key_bytes + 4096 > conf.max_message_bytes) {
    throw Error(
        "--rdzv_conf: max_message_bytes must exceed max_key_bytes + max_value_bytes + 4096");
  }
  return conf;
}

}  // namespace ddp::launcher
