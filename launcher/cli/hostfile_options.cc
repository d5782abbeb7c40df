#include "cli/hostfile_options.h"

#include <CLI/CLI.hpp>

namespace ddp::launcher {

void declare_hostfile_options(CLI::App& app, HostfileText& text) {
  app.add_option("--hostfile", text.hostfile,
                 "Run on the hosts of FILE ('HOST slots=N' lines, '#' comments; also 'HOST:N'): "
                 "this ddprun starts one agent per host over ssh");
  app.add_option("-H,--hosts", text.hosts,
                 "Run on these hosts over ssh: HOST:SLOTS,... (as mpirun -H, horovodrun -H)");
  app.add_option("--include", text.include,
                 "Only these hosts of the hostfile (DeepSpeed's syntax: a@b:0,2 picks b's slots 0 "
                 "and 2)");
  app.add_option("--exclude", text.exclude,
                 "Every host of the hostfile but these (a@b:1 drops host a and b's slot 1)");
  app.add_option("--ssh_port,--ssh-port", text.ssh_port,
                 "ssh port of every host (default: ssh's, from its config)");
  app.add_option("--ssh_opts,--ssh-opts", text.ssh_opts,
                 "Extra ssh options, split as a shell would (e.g. \"-F cfg -i key\")");
  app.add_option("--ssh_timeout,--ssh-timeout", text.ssh_timeout_s,
                 "Seconds for every host to answer over ssh before the launch fails (default 10)");
  app.add_option("--env", text.env,
                 "NAME=VALUE or NAME (this shell's value) for the workers on every host; "
                 "repeatable")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

const std::vector<std::string>& hostfile_flag_names() {
  static const std::vector<std::string> names = {"--hostfile",    "--hosts",    "--include",
                                                 "--exclude",     "--ssh_port", "--ssh_opts",
                                                 "--ssh_timeout", "--env"};
  return names;
}

const std::vector<std::string>& flags_set_by_front_end() {
  static const std::vector<std::string> names = {
      "--node_rank",   "--rdzv_endpoint", "--rdzv_backend", "--master_addr",
      "--master_port", "--standalone",    "--local_addr"};
  return names;
}

}  // namespace ddp::launcher
