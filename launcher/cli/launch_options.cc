#include "cli/launch_options.h"

#include <CLI/CLI.hpp>

#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

void declare_job_shape(CLI::App& app, LaunchSpec& spec, LaunchText& text) {
  app.add_option("--nproc_per_node,--nproc-per-node", spec.nproc_per_node_text,
                 "Workers on this node: N, auto (GPUs, else XPUs, else CPUs), cpu, gpu, xpu")
      ->envname("PET_NPROC_PER_NODE");
  app.add_option("--nnodes", text.nnodes, "Number of nodes (N or MIN:MAX)")->envname("PET_NNODES");
  app.add_option("--node_rank,--node-rank", spec.node_rank,
                 "Rank of this node (default: assigned by the rendezvous; 0 hosts the rendezvous)")
      ->envname("PET_NODE_RANK");
  app.add_option(
         "--rdzv_endpoint,--rdzv-endpoint", spec.rdzv_endpoint,
         "Rendezvous HOST[:PORT] (default port 29400; single node: 127.0.0.1 on a free port)")
      ->envname("PET_RDZV_ENDPOINT");
  app.add_option("--rdzv_backend,--rdzv-backend", text.rdzv_backend,
                 "static (node rank 0 hosts the rendezvous) or c10d (the node at the endpoint's "
                 "address hosts it, ranks assigned); default: static with --node_rank, else c10d")
      ->envname("PET_RDZV_BACKEND");
  app.add_option(
         "--rdzv_conf,--rdzv-conf", text.rdzv_conf,
         "key=value,...: join_timeout (timeout), last_call_timeout, close_timeout, read_timeout, "
         "is_host, heartbeat_interval (keep_alive_interval), heartbeat_timeout, "
         "keep_alive_max_attempt, max_key_bytes, max_value_bytes, max_keys, max_store_bytes, "
         "max_pending_waits, max_message_bytes")
      ->envname("PET_RDZV_CONF");
  app.add_option("--rdzv_token,--rdzv-token", spec.rdzv_token,
                 "Shared secret every rendezvous request carries (or DDP_RDZV_TOKEN); the same on "
                 "every node. Visible to other users in ps: prefer DDP_RDZV_TOKEN")
      ->envname("DDP_RDZV_TOKEN");
  app.add_option("--rdzv_token_file,--rdzv-token-file", text.token_file,
                 "Read the rendezvous token from this file (first line), kept out of ps")
      ->envname("DDP_RDZV_TOKEN_FILE");
  app.add_option("--local_addr,--local-addr", spec.local_addr,
                 "Address advertised to other nodes (default: the one that routes to the endpoint)")
      ->envname("PET_LOCAL_ADDR");
  app.add_option("--rdzv_tls_cert,--rdzv-tls-cert", spec.tls_cert,
                 "PEM certificate (server: node 0)");
  app.add_option("--rdzv_tls_key,--rdzv-tls-key", spec.tls_key,
                 "PEM private key for --rdzv_tls_cert");
  app.add_option("--rdzv_tls_ca,--rdzv-tls-ca", spec.tls_ca,
                 "PEM CA that signed the server's certificate");
  app.add_option("--master_addr,--master-addr", spec.master_addr, "MASTER_ADDR given to workers")
      ->envname("PET_MASTER_ADDR");
  app.add_option("--master_port,--master-port", spec.master_port,
                 "MASTER_PORT given to workers (default: a free port ddprun reserves)")
      ->envname("PET_MASTER_PORT");
  app.add_flag("--standalone", spec.standalone, "Single-node job with a local rendezvous")
      ->envname("PET_STANDALONE");
  app.add_option(
         "--run_id,--run-id,--rdzv_id,--rdzv-id", text.run_id,
         "Job id, the same on every node (or PET_RDZV_ID; default: 'none' with several nodes, "
         "else a unique id)")
      ->envname("PET_RUN_ID");
  app.add_option("--role", spec.role, "ROLE_NAME given to workers")->envname("PET_ROLE");
}

void declare_supervision(CLI::App& app, LaunchSpec& spec, LaunchText& text) {
  app.add_option("--max_restarts,--max-restarts", spec.max_restarts,
                 "Restarts of the whole worker group before failing")
      ->envname("PET_MAX_RESTARTS");
  app.add_option("--on_failure,--on-failure", text.on_failure,
                 "restart (default): a failed worker stops the group, restarted while "
                 "--max_restarts allow; heal: a rank that opted into libddp's healing is "
                 "relaunched alone (one of --max_restarts each) while the others go on")
      ->envname("PET_ON_FAILURE");
  app.add_option("--monitor_interval,--monitor-interval", spec.monitor_interval_s,
                 "Seconds between supervision checks (exits are seen at once regardless)")
      ->envname("PET_MONITOR_INTERVAL");
  app.add_option("--hang_timeout,--hang-timeout", spec.hang_timeout_s,
                 "Seconds a rank may go without progress (collectives, or CPU time) before the job "
                 "is reported "
                 "hung, with each stuck rank's stack, and stopped; 0 (default): off")
      ->envname("PET_HANG_TIMEOUT");
  app.add_option("--shutdown_timeout,--shutdown-timeout", spec.shutdown_timeout_s,
                 "Seconds between SIGTERM and SIGKILL when stopping workers (default: "
                 "TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30)")
      ->envname("PET_SHUTDOWN_TIMEOUT");
  app.add_flag("--virtual_local_rank,--virtual-local-rank", spec.virtual_local_rank,
               "Give every worker LOCAL_RANK=0 and only its own device in CUDA_VISIBLE_DEVICES")
      ->envname("PET_VIRTUAL_LOCAL_RANK");
  app.add_flag("--bind_cores_to_rank,--bind-cores-to-rank", spec.bind_cores_to_rank,
               "Run each local rank on its own slice of ddprun's CPUs (round-robin, one CPU each, "
               "when ranks outnumber CPUs)")
      ->envname("PET_BIND_CORES_TO_RANK");
}

void declare_output(CLI::App& app, LaunchSpec& spec, LaunchText& text) {
  app.add_option(
         "--log_dir,--log-dir", spec.log_dir,
         "Write LOG_DIR/<run_id>_<random>/attempt_<k>/<local rank>/{stdout,stderr}.log, error.json")
      ->envname("PET_LOG_DIR");
  app.add_option("--metrics_port,--metrics-port", spec.metrics_port,
                 "Serve Prometheus metrics of this node and its ranks on this TCP port "
                 "(http://HOST:PORT/metrics); 0 (default): off")
      ->envname("PET_METRICS_PORT");
  app.add_option("--events_file,--events-file", spec.events_file,
                 "Append the job's events (rounds, worker starts and exits, failures, restarts, "
                 "relaunches, hangs, stragglers) to this file as JSON lines")
      ->envname("PET_EVENTS_FILE");
  app.add_option("--status_interval,--status-interval", spec.status_interval_s,
                 "Seconds between samples of the workers' state for ddprun status and the "
                 "metrics (default 1); 0: off")
      ->envname("PET_STATUS_INTERVAL");
  app.add_option("--straggler_window,--straggler-window", spec.straggler_window_s,
                 "Seconds of samples over which a libddp rank the others wait for is judged a "
                 "straggler (default 40); 0: off")
      ->envname("PET_STRAGGLER_WINDOW");
  app.add_option("-r,--redirects", text.redirects,
                 "Send streams only to the log files: 0 none, 1 stdout, 2 stderr, 3 both; or "
                 "LOCAL_RANK:BITS,...")
      ->envname("PET_REDIRECTS");
  app.add_option("-t,--tee", text.tee,
                 "Send streams to the console and the log files (same syntax)")
      ->envname("PET_TEE");
  app.add_option(
         "--local_ranks_filter,--local-ranks-filter", text.local_ranks_filter,
         "Show only these local ranks on the console, e.g. 0,2 (ranks this node lacks are ignored)")
      ->envname("PET_LOCAL_RANKS_FILTER");
  app.add_flag("--no_prefix,--no-prefix", text.no_prefix,
               "Do not prefix worker output lines with [rank N]")
      ->envname("PET_NO_PREFIX");
}

void declare_program(CLI::App& app, LaunchSpec& spec) {
  app.add_flag("--no_python,--no-python", spec.no_python,
               "Run PROGRAM directly even when it is a Python script")
      ->envname("PET_NO_PYTHON");
  app.add_flag("-m,--module", spec.module, "Run PROGRAM as a Python module (python3 -m)")
      ->envname("PET_MODULE");
}

void declare_torchrun_only(CLI::App& app, LaunchText& text) {
  app.add_option("--start_method,--start-method", text.start_method,
                 "torchrun's; no effect (workers are exec'd)")
      ->envname("PET_START_METHOD");
  app.add_option("--logs_specs,--logs-specs", text.logs_specs,
                 "torchrun's; no effect (see --log_dir)")
      ->envname("PET_LOGS_SPECS");
  app.add_option("--log_line_prefix_template,--log-line-prefix-template", text.line_prefix_template,
                 "torchrun's; no effect (lines are prefixed [rank N]; see --no_prefix)")
      ->envname("PET_LOG_LINE_PREFIX_TEMPLATE");
  app.add_flag("--run_path,--run-path", text.run_path,
               "torchrun's; no effect (PROGRAM is run as given)")
      ->envname("PET_RUN_PATH");
  app.add_option("--numa_binding,--numa-binding", text.numa_binding,
                 "torchrun's; not implemented (see --bind_cores_to_rank)")
      ->envname("PET_NUMA_BINDING");
  app.add_option("--event_log_handler,--event-log-handler", text.event_log_handler,
                 "torchrun's; no effect (ddprun logs its events to stderr)")
      ->envname("PET_EVENT_LOG_HANDLER");
  app.add_option("--signals_to_handle,--signals-to-handle", text.signals_to_handle,
                 "torchrun's; ddprun always stops on SIGTERM, SIGINT, SIGHUP, SIGQUIT and forwards "
                 "SIGUSR1, SIGUSR2")
      ->envname("PET_SIGNALS_TO_HANDLE");
  app.add_option("--duplicate_stdout_filters,--duplicate-stdout-filters",
                 text.duplicate_stdout_filters, "torchrun's; no effect (see --tee)")
      ->envname("PET_DUPLICATE_STDOUT_FILTERS");
  app.add_option("--duplicate_stderr_filters,--duplicate-stderr-filters",
                 text.duplicate_stderr_filters, "torchrun's; no effect (see --tee)")
      ->envname("PET_DUPLICATE_STDERR_FILTERS");
  app.add_option("--print_completion,--print-completion", text.print_completion,
                 "Print a completion script for SHELL (bash, zsh, tcsh) and exit");
}

}  // namespace

void declare_launch_options(CLI::App& app, LaunchSpec& spec, LaunchText& text) {
  declare_job_shape(app, spec, text);
  declare_supervision(app, spec, text);
  declare_output(app, spec, text);
  declare_program(app, spec);
  declare_torchrun_only(app, text);
  declare_hostfile_options(app, text.hosts);
}

std::vector<KnownOption> known_options(const CLI::App& app) {
  std::vector<KnownOption> known;
  for (const CLI::Option* option : app.get_options()) {
    KnownOption k;
    for (const auto& name : option->get_lnames()) k.long_names.push_back("--" + name);
    // A flag (--no_prefix) expects no value, though CLI11 gives it a type size of 1.
    k.takes_value = option->get_type_size_max() > 0 && option->get_expected_max() > 0;
    if (!option->get_snames().empty()) {
      k.has_short_name = true;
      k.short_name = "-" + option->get_snames().front();
    }
    known.push_back(std::move(k));
  }
  return known;
}

std::vector<std::string> torchrun_only_notices(const LaunchText& text) {
  std::vector<std::string> notices;
  auto has_no_effect = [&](const std::string& flag, const std::string& value,
                           const std::string& why) {
    if (!value.empty()) notices.push_back(flag + "=" + value + " has no effect: " + why);
  };
  has_no_effect("--start_method", text.start_method,
                "ddprun always starts each worker as a new process (fork + exec)");
  has_no_effect("--logs_specs", text.logs_specs,
                "per-rank logs are set with --log_dir, --redirects and --tee");
  const std::string prefix_why =
      " has no effect: lines are prefixed with [rank N] (--no_prefix turns that off)";
  if (!text.line_prefix_template.empty()) {
    notices.push_back("--log_line_prefix_template" + prefix_why);
  } else if (!text.line_prefix_template_variable.empty()) {
    notices.push_back("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" + prefix_why);
  }
  if (text.run_path) notices.push_back("--run_path has no effect: PROGRAM is run as given");
  if (!text.numa_binding.empty()) {
    notices.push_back(
        "--numa_binding=" + text.numa_binding +
        " is not implemented; workers keep ddprun's NUMA policy (--bind_cores_to_rank "
        "gives each local rank its own CPUs)");
  }
  if (text.event_log_handler != "" && text.event_log_handler != "null") {
    has_no_effect("--event_log_handler", text.event_log_handler,
                  "ddprun logs its events to its stderr");
  }
  if (!text.signals_to_handle.empty() &&
      text.signals_to_handle != "SIGTERM,SIGINT,SIGHUP,SIGQUIT") {
    has_no_effect(
        "--signals_to_handle", text.signals_to_handle,
        "ddprun always stops the workers on SIGTERM, SIGINT, SIGHUP and SIGQUIT, and forwards "
        "SIGUSR1 and SIGUSR2 to them without stopping");
  }
  has_no_effect("--duplicate_stdout_filters", text.duplicate_stdout_filters,
                "use --tee to keep each rank's stdout in a file");
  has_no_effect("--duplicate_stderr_filters", text.duplicate_stderr_filters,
                "use --tee to keep each rank's stderr in a file");
  return notices;
}

std::string completion_script(const CLI::App& app, const std::string& shell) {
  std::string words;
  for (const auto& option : known_options(app)) {
    for (const auto& name : option.long_names) words += (words.empty() ? "" : " ") + name;
  }
  const std::string bash =
      "_ddprun() {\n"
      "  local cur=${COMP_WORDS[COMP_CWORD]}\n"
      "  if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W \"" +
      words +
      "\" -- \"$cur\"));\n"
      "  else COMPREPLY=($(compgen -f -- \"$cur\")); fi\n"
      "}\n"
      "complete -o filenames -F _ddprun ddprun\n";
  if (shell == "bash") return bash;
  if (shell == "zsh") return "autoload -U +X bashcompinit && bashcompinit\n" + bash;
  if (shell == "tcsh") {
    std::string bare;  // tcsh completes the word after "--"
    for (size_t at = 0; at < words.size();) {
      size_t end = words.find(' ', at);
      if (end == std::string::npos) end = words.size();
      bare += (bare.empty() ? "" : " ") + words.substr(at + 2, end - at - 2);
      at = end + 1;
    }
    return "complete ddprun 'c/--/(" + bare + ")/' 'p/*/f/'\n";
  }
  throw Error("--print_completion=" + shell + ": expected bash, zsh or tcsh");
}

}  // namespace ddp::launcher
