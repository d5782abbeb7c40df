#include "cli/rdzv_conf.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>

#include "ddp/common/error.h"

namespace ddp::launcher {

namespace {

// Durations in seconds (> 0, the last call may be 0) and sizes in bytes or
// counts (>= 1), by key; close_timeout is kept apart (only a positive value
// replaces the default).
const std::map<std::string, double RdzvConf::*>& second_keys() {
  static const std::map<std::string, double RdzvConf::*> keys = {
      {"join_timeout", &RdzvConf::join_timeout_s},
      {"last_call_timeout", &RdzvConf::last_call_timeout_s},
      {"heartbeat_interval", &RdzvConf::heartbeat_interval_s},
      {"keep_alive_interval", &RdzvConf::heartbeat_interval_s},  // torchrun's name
      {"heartbeat_timeout", &RdzvConf::heartbeat_timeout_s},
      {"read_timeout", &RdzvConf::read_timeout_s}};
  return keys;
}

// The smallest max_key_bytes accepted.
constexpr long long kMinKeyBytes = 256;

const std::map<std::string, long long RdzvConf::*>& size_keys() {
  static const std::map<std::string, long long RdzvConf::*> keys = {
      {"max_key_bytes", &RdzvConf::max_key_bytes},
      {"max_value_bytes", &RdzvConf::max_value_bytes},
      {"max_keys", &RdzvConf::max_keys},
      {"max_store_bytes", &RdzvConf::max_store_bytes},
      {"max_pending_waits", &RdzvConf::max_pending_waits},
      {"max_message_bytes", &RdzvConf::max_message_bytes}};
  return keys;
}

// torchrun's spellings of a boolean.
bool parse_is_host(const std::string& value) {
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "1" || v == "true" || v == "t" || v == "yes" || v == "y" || v == "on") return true;
  if (v == "0" || v == "false" || v == "f" || v == "no" || v == "n" || v == "off") return false;
  throw Error("--rdzv_conf: is_host=" + value + " is not a boolean (1/0, true/false)");
}

// Said of a key or value with a quote in it: a quoted list passed on with
// its quotes (a generated script quoting inside a variable).
std::string quote_hint(const std::string& text) {
  return text.find_first_of("'\"") == std::string::npos
             ? ""
             : " (a quote is left in it: the shell did not remove the quotes around the list)";
}

double parse_number(const std::string& key, const std::string& value) {
  try {
    size_t used = 0;
    const double number = std::stod(value, &used);
    if (used != value.size()) throw std::invalid_argument(value);
    return number;
  } catch (const std::exception&) {
    throw Error("--rdzv_conf: " + key + "=" + value + " is not a number" + quote_hint(value));
  }
}

// torchrun's own spellings ddprun reads, and the one handler of torch 2.x
// that reads each (see TorchHandler).
std::optional<TorchHandler> torchrun_spelling(const std::string& key) {
  if (key == "timeout") return TorchHandler::kStatic;
  if (key == "keep_alive_interval" || key == "keep_alive_max_attempt" || key == "is_host") {
    return TorchHandler::kC10d;
  }
  return std::nullopt;
}

// Why a torchrun spelling has no effect under the other handler.
std::string why_not_read(const std::string& key) {
  if (key == "timeout") {
    return "torchrun reads timeout only in its static rendezvous (--rdzv_backend=static with "
           "--master_port or --rdzv_endpoint); with c10d, --standalone or one node without "
           "--master_port, the join timeout is join_timeout";
  }
  if (key == "is_host") {
    return "in the static form node rank 0 hosts the rendezvous (torchrun reads is_host only with "
           "--rdzv_backend=c10d)";
  }
  return "torchrun reads " + key +
         " only with --rdzv_backend=c10d (or --standalone); in the static form the heartbeats are "
         "set with heartbeat_interval and heartbeat_timeout";
}

std::string trimmed(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// The keys of one --rdzv_conf, then what they imply together.
class ConfParser {
 public:
  ConfParser(TorchHandler handler, std::vector<std::string>* notices)
      : handler_(handler), notices_(notices) {}
  void item(const std::string& key, const std::string& value);
  RdzvConf finish();

 private:
  void notice(const std::string& line) {
    if (notices_ != nullptr) notices_->push_back(line);
  }
  void number(const std::string& key, const std::string& value);

  void finish_join_timeout();

  TorchHandler handler_;
  std::vector<std::string>* notices_;
  RdzvConf conf_;
  double close_timeout_ = 0, keep_alive_attempts_ = 0;  // 0: not given (both must be > 0)
  std::optional<double> timeout_;                       // torchrun's static `timeout`
  bool heartbeat_timeout_given_ = false, join_timeout_given_ = false;
};

void ConfParser::item(const std::string& key, const std::string& value) {
  if (key == "use_libuv" || key == "store_type") {
    return notice("--rdzv_conf " + key + "=" + value +
                  " has no effect: ddprun's rendezvous is its own gRPC server");
  }
  if (auto reader = torchrun_spelling(key); reader && *reader != handler_) {
    return notice("--rdzv_conf " + key + "=" + value + " has no effect: " + why_not_read(key));
  }
  if (key == "is_host") {
    conf_.is_host = parse_is_host(value);
    return;
  }
  if (!second_keys().count(key) && !size_keys().count(key) && key != "close_timeout" &&
      key != "keep_alive_max_attempt" && key != "timeout") {
    // torchrun hands unknown keys to custom backends and ignores them otherwise.
    return notice(
        "--rdzv_conf " + key + "=" + value +
        " has no effect: not a key ddprun knows (join_timeout, last_call_timeout, "
        "close_timeout, read_timeout, heartbeat_interval, heartbeat_timeout, max_key_bytes, "
        "max_value_bytes, max_keys, max_store_bytes, max_pending_waits, max_message_bytes; "
        "torchrun's timeout with --rdzv_backend=static, is_host, keep_alive_interval and "
        "keep_alive_max_attempt with c10d)" +
        quote_hint(key));
  }
  number(key, value);
}

void ConfParser::number(const std::string& key, const std::string& value) {
  const double number = parse_number(key, value);
  if (key == "keep_alive_max_attempt") {
    if (!(number >= 1 && number <= 1000000) || number != static_cast<long long>(number)) {
      throw Error("--rdzv_conf: keep_alive_max_attempt=" + value + " must be a whole number >= 1");
    }
    keep_alive_attempts_ = number;
  } else if (auto sz = size_keys().find(key); sz != size_keys().end()) {
    if (!(number >= 1) || number > 1024.0 * 1024 * 1024 ||
        number != static_cast<long long>(number)) {
      throw Error("--rdzv_conf: " + key + "=" + value + " must be a whole number in [1, 2^30]");
    }
    if (key == "max_key_bytes" && number < kMinKeyBytes) {
      // Else the job would fail at its first long key, far from this flag.
      throw Error("--rdzv_conf: max_key_bytes=" + value + " is below " +
                  std::to_string(kMinKeyBytes) +
                  ": ddprun's, libddp's and torch's own store keys need up to about 100 bytes "
                  "plus the run id (--rdzv_id)");
    }
    conf_.*(sz->second) = static_cast<long long>(number);
  } else {
    const bool may_be_zero = key == "last_call_timeout";
    if (!(number >= 0) || (!may_be_zero && number == 0) || number > 365 * 86400.0) {
      throw Error("--rdzv_conf: " + key + "=" + value + " is out of range (seconds)");
    }
    if (key == "close_timeout") {
      close_timeout_ = number;
    } else if (key == "timeout") {
      timeout_ = number;
    } else {
      conf_.*(second_keys().at(key)) = number;
    }
    if (key == "heartbeat_timeout") heartbeat_timeout_given_ = true;
    if (key == "join_timeout") join_timeout_given_ = true;
  }
}

// The static form's `timeout` is its join timeout, as torchrun's static
// handler reads it; given beside join_timeout, it wins.
void ConfParser::finish_join_timeout() {
  if (!timeout_) return;
  if (join_timeout_given_ && conf_.join_timeout_s != *timeout_) {
    notice(
        "--rdzv_conf join_timeout has no effect: timeout is given and sets the join timeout of "
        "the static form, as under torchrun");
  }
  conf_.join_timeout_s = *timeout_;
}

RdzvConf ConfParser::finish() {
  finish_join_timeout();
  if (close_timeout_ > 0) conf_.close_timeout_s = close_timeout_;
  if (keep_alive_attempts_ > 0) {
    if (heartbeat_timeout_given_) {
      notice(
          "--rdzv_conf keep_alive_max_attempt has no effect: heartbeat_timeout is given and sets "
          "when a silent node is declared gone");
    } else {
      conf_.heartbeat_timeout_s = conf_.heartbeat_interval_s * keep_alive_attempts_;
    }
  }
  if (!heartbeat_timeout_given_ && keep_alive_attempts_ == 0 &&
      conf_.heartbeat_interval_s >= conf_.heartbeat_timeout_s) {
    // torchrun's keep_alive_max_attempt default
    conf_.heartbeat_timeout_s = conf_.heartbeat_interval_s * 3;
  }
  if (conf_.heartbeat_interval_s >= conf_.heartbeat_timeout_s) {
    throw Error("--rdzv_conf: heartbeat_interval must be shorter than heartbeat_timeout");
  }
  if (conf_.max_value_bytes + conf_.max_key_bytes + 4096 > conf_.max_message_bytes) {
    throw Error(
        "--rdzv_conf: max_message_bytes must exceed max_key_bytes + max_value_bytes + 4096");
  }
  return conf_;
}

}  // namespace

TorchHandler torch_handler(const TorchrunShape& shape) {
  if (shape.standalone) return TorchHandler::kC10d;
  if (shape.max_nodes == 1 && !shape.endpoint_given && !shape.master_port_given) {
    return TorchHandler::kC10d;
  }
  if (!shape.backend.empty()) {
    return shape.backend == "static" ? TorchHandler::kStatic : TorchHandler::kC10d;
  }
  if (shape.max_nodes == 1) return TorchHandler::kStatic;
  return shape.node_rank_given && shape.min_nodes == shape.max_nodes ? TorchHandler::kStatic
                                                                     : TorchHandler::kC10d;
}

RdzvConf parse_rdzv_conf(const std::string& text, TorchHandler handler,
                         std::vector<std::string>* notices) {
  ConfParser parser(handler, notices);
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (trimmed(item).empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) throw Error("--rdzv_conf: '" + item + "' is not key=value");
    parser.item(trimmed(item.substr(0, eq)), trimmed(item.substr(eq + 1)));
  }
  return parser.finish();
}

}  // namespace ddp::launcher
