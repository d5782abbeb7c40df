#pragma once
// The launcher's flags as CLI11 options: torchrun's (both spellings, with
// their PET_* variables) and ddprun's own. Declaring them is all this file
// does; launch_spec.cc checks and combines the values.

#include <string>
#include <vector>

#include "cli/hostfile_options.h"
#include "cli/launch_spec.h"
#include "cli/option_prefixes.h"

namespace ddp::launcher {

// Values kept as given, for launch_spec.cc to check after parsing.
struct LaunchText {
  std::string nnodes = "1", redirects, tee, local_ranks_filter, run_id, rdzv_conf, rdzv_backend,
              token_file, on_failure = "restart";
  bool no_prefix = false;
  // torchrun flags with nothing (or something else) to do here: accepted,
  // so that a copied command line runs, with one line saying why.
  std::string start_method, logs_specs, numa_binding, line_prefix_template, event_log_handler;
  std::string signals_to_handle, duplicate_stdout_filters, duplicate_stderr_filters,
      print_completion;
  bool run_path = false;
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, torchrun's variable for
  // --log_line_prefix_template (which wins over it).
  std::string line_prefix_template_variable;
  HostfileText hosts;  // --hostfile and its flags: the front end's (hostfile_args.h)
};

void declare_launch_options(CLI::App& app, LaunchSpec& spec, LaunchText& text);

// Every long option of `app`, for argparse-style abbreviations.
std::vector<KnownOption> known_options(const CLI::App& app);

// One notice for each accepted torchrun flag that changes nothing here.
std::vector<std::string> torchrun_only_notices(const LaunchText& text);

// `torchrun --print-completion SHELL`: a completion script for ddprun's flags
// (bash, zsh through bashcompinit, tcsh). Throws ddp::Error for another shell.
std::string completion_script(const CLI::App& app, const std::string& shell);

}  // namespace ddp::launcher
