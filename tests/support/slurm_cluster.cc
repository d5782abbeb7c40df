#include "slurm_cluster.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// The cluster's directory is <tmp>/ddpslurm-<owner pid>-XXXXXX; its path is in
// every daemon's command line and in SLURM_CONF of every daemon, step and task,
// which is how the leftovers of a killed test binary are found.
constexpr const char* kMarker = "ddpslurm-";
constexpr auto kPoll = 100ms;

std::string temp_base() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

// Full path of `name` on PATH or in the sbin directories (root's programs), or "".
std::string find_program(const std::string& name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/local/sbin:/usr/sbin:/sbin:/usr/bin:/bin";
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string program(const std::string& name) {
  std::string p = find_program(name);
  if (p.empty()) throw std::runtime_error("slurm cluster: " + name + " not found");
  return p;
}

// Polls `pred` every kPoll until it holds or `timeout` passes.
bool poll(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kPoll);
  }
  return true;
}

std::string tail(const std::string& text, int lines) {
  if (text.empty()) return text;
  size_t pos = text.size();
  if (text.back() == '\n') --pos;
  for (int n = 0; n < lines && pos != std::string::npos && pos > 0; ++n)
    pos = text.rfind('\n', pos - 1);
  return pos == std::string::npos || pos == 0 ? text : text.substr(pos + 1);
}

// Variables of the test's own environment that would tie a client command or
// daemon to a Slurm job or cluster outside the test cluster.
std::vector<std::string> foreign_slurm_variables() {
  std::vector<std::string> names;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    for (const char* prefix : {"SLURM", "SBATCH_", "SALLOC_", "SRUN_"}) {
      if (name.rfind(prefix, 0) == 0) {
        names.push_back(name);
        break;
      }
    }
  }
  return names;
}

// The owner pid named by "ddpslurm-<pid>-" in `text`, or 0.
pid_t owner_in(const std::string& text) {
  const std::string marker = kMarker;
  for (size_t pos = text.find(marker); pos != std::string::npos; pos = text.find(marker, pos + 1)) {
    size_t end = pos + marker.size();
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end > pos + marker.size() && end < text.size() && text[end] == '-') {
      return static_cast<pid_t>(
          std::atol(text.substr(pos + marker.size(), end - pos - marker.size()).c_str()));
    }
  }
  return 0;
}

bool gone(pid_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

std::vector<pid_t> netns_pids(const std::string& ns) {
  std::vector<pid_t> pids;
  ProcessResult r = run_process({"ip", "netns", "pids", ns}, {}, 10s);
  std::stringstream ss(r.out);
  long pid = 0;
  while (ss >> pid) {
    if (pid > 0 && pid != getpid()) pids.push_back(static_cast<pid_t>(pid));
  }
  return pids;
}

std::string net_namespace(const std::string& pid) {
  std::error_code ec;
  return fs::read_symlink("/proc/" + pid + "/ns/net", ec).string();
}

// Kills what a killed test binary left: processes on test hosts (any network
// namespace but ours) whose command line or environment names a cluster
// directory of a dead owner (daemons, slurmstepd, job scripts, tasks), also
// when another test already removed the namespaces' names; processes in the
// still named namespaces of dead owners (which NetnsHosts then removes); and
// the directories.
void kill_stale() {
  const pid_t self = getpid();
  const std::string our_net = net_namespace("self");
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc", ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str()));
    if (pid == self) continue;
    const std::string net = net_namespace(name);
    if (net.empty() || net == our_net) continue;
    pid_t owner = owner_in(read_file("/proc/" + name + "/cmdline"));
    if (owner == 0) owner = owner_in(read_file("/proc/" + name + "/environ"));
    if (owner != 0 && owner != self && gone(owner)) kill(pid, SIGKILL);
  }
  ProcessResult list = run_process({"ip", "netns", "list"}, {}, 10s);
  for (const auto& line : lines_with_prefix(list.out, "ddpt")) {
    const pid_t owner = static_cast<pid_t>(std::atol(line.c_str()));
    if (!gone(owner)) continue;
    for (pid_t pid : netns_pids("ddpt" + line.substr(0, line.find(' ')))) kill(pid, SIGKILL);
  }
  ec.clear();
  for (const auto& entry : fs::directory_iterator(temp_base(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kMarker, 0) != 0) continue;
    const pid_t owner = owner_in(name);
    if (owner != 0 && owner != self && gone(owner)) fs::remove_all(entry.path(), ec);
  }
}

std::string make_cluster_dir() {
  std::string templ = temp_base() + "/" + kMarker + std::to_string(getpid()) + "-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr)
    throw std::runtime_error("slurm cluster: cannot create " + templ);
  // munged insists that everyone may search its socket's directory.
  chmod(buf.data(), 0755);
  return buf.data();
}

}  // namespace

std::string SlurmCluster::unavailable() {
  if (geteuid() != 0) return "needs root to run slurmctld, slurmd and munged (CI runs as root)";
  for (const char* p : {"slurmctld", "slurmd", "srun", "sbatch", "scancel", "squeue", "sinfo",
                        "munged", "unshare", "hostname"}) {
    if (find_program(p).empty())
      return std::string(p) + " not installed (scripts/install-deps.sh installs Slurm)";
  }
  if (find_program("mungekey").empty() && find_program("create-munge-key").empty()) {
    return "neither mungekey nor create-munge-key is installed (scripts/install-deps.sh installs "
           "munge)";
  }
  return NetnsHosts::unavailable();
}

SlurmCluster::SlurmCluster(int nodes, int cpus_per_node) : nodes_(nodes) {
  if (nodes < 1 || cpus_per_node < 1)
    throw std::invalid_argument("slurm cluster: needs nodes >= 1 and cpus >= 1");
  const auto start = std::chrono::steady_clock::now();
  unshare_ = program("unshare");
  kill_stale();
  try {
    bring_up(cpus_per_node);
  } catch (...) {
    shutdown();
    throw;
  }
  bring_up_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

SlurmCluster::~SlurmCluster() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "slurm cluster: teardown failed: %s\n", e.what());
  }
}

std::string SlurmCluster::node_name(int i) const { return "n" + std::to_string(i + 1); }

std::string SlurmCluster::node_address(int i) const { return hosts_->address(i); }

std::map<std::string, std::string> SlurmCluster::env() const {
  std::map<std::string, std::string> env;
  for (const auto& name : foreign_slurm_variables()) env[name] = "\x01";
  env["SLURM_CONF"] = conf();
  return env;
}

std::vector<std::string> SlurmCluster::on_node(int i, const std::vector<std::string>& argv) const {
  std::vector<std::string> full = {"env"};
  for (const auto& name : foreign_slurm_variables()) {
    full.push_back("-u");
    full.push_back(name);
  }
  full.push_back("SLURM_CONF=" + conf());
  full.insert(full.end(), argv.begin(), argv.end());
  return as_node(i, full);
}

std::vector<std::string> SlurmCluster::on_login(const std::vector<std::string>& argv) const {
  return on_node(0, argv);
}

// `argv` on node i's host, in a UTS namespace of its own whose hostname is the
// node's name (slurmctld checks that it runs on SlurmctldHost; steps, and
// commands on the login node, see their node's name).
std::vector<std::string> SlurmCluster::as_node(int i, const std::vector<std::string>& argv) const {
  std::vector<std::string> full = {
      unshare_, "--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\"", node_name(i)};
  full.insert(full.end(), argv.begin(), argv.end());
  return hosts_->on(i, full);
}

void SlurmCluster::write_config(int cpus_per_node) const {
  std::ostringstream c;
  c << "# Written by tests/support/slurm_cluster.cc for one test; removed with it.\n"
    << "ClusterName=ddptest\n"
    << "SlurmctldHost=" << node_name(0) << "(" << node_address(0) << ")\n"
    << "SlurmUser=root\nSlurmdUser=root\n"
    << "AuthType=auth/munge\nCredType=cred/munge\n"
    << "AuthInfo=socket=" << dir_
    << "/munge.socket\n"
    // Every slurmd has a namespace of its own, so all can use the same port.
    << "SlurmctldPort=6817\nSlurmdPort=6818\n"
    << "StateSaveLocation=" << dir_ << "/state\n"
    << "SlurmdSpoolDir=" << dir_ << "/spool/%n\n"
    << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\n"
    << "SlurmdPidFile=" << dir_ << "/slurmd-%n.pid\n"
    << "SlurmctldLogFile=" << dir_ << "/slurmctld.log\n"
    << "SlurmdLogFile=" << dir_ << "/slurmd-%n.log\n"
    << "SlurmctldDebug=info\nSlurmdDebug=info\n"
    // No cgroups, no accounting: nothing outside the directory is touched.
    << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
    << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
    << "JobCompType=jobcomp/none\n"
    << "SchedulerType=sched/builtin\nSchedulerParameters=batch_sched_delay=0\n"
    << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
    << "MpiDefault=none\n"
    << "ReturnToService=2\n"
    // The nodes have the CPUs written here, whatever the machine has.
    << "SlurmdParameters=config_overrides\n"
    // Slurm's default KillWait: what ends a cancelled job's processes within
    // seconds is ddprun, not the SIGKILL that follows the wait.
    << "KillWait=30\nMessageTimeout=5\nTCPTimeout=2\n"
    << "SlurmctldTimeout=10\nSlurmdTimeout=10\nInactiveLimit=0\nMinJobAge=2\n"
    << "MailProg=/bin/true\n";
  for (int i = 0; i < nodes_; ++i) {
    c << "NodeName=" << node_name(i) << " NodeAddr=" << node_address(i) << " CPUs=" << cpus_per_node
      << " State=UNKNOWN\n";
  }
  c << "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n";
  write_file(conf(), c.str());
  // slurmd initialises a cgroup plugin even with proctrack/linuxproc and
  // task/none; autodetection fails in a namespace (`ip netns exec` mounts a
  // fresh /sys without /sys/fs/cgroup), while cgroup/v1 initialises without
  // touching any cgroup, and none is used.
  write_file(dir_ + "/cgroup.conf", "CgroupPlugin=cgroup/v1\n");
}

void SlurmCluster::bring_up(int cpus_per_node) {
  dir_ = make_cluster_dir();
  fs::create_directories(dir_ + "/state");
  for (int i = 0; i < nodes_; ++i) fs::create_directories(dir_ + "/spool/" + node_name(i));
  hosts_ = std::make_unique<NetnsHosts>(nodes_);
  // Node names resolve on every node, as on a real cluster (jobs connect to them).
  std::vector<std::string> names;
  for (int i = 0; i < nodes_; ++i) names.push_back(node_name(i));
  hosts_->name_hosts(names);
  write_config(cpus_per_node);

  const std::string key = dir_ + "/munge.key";
  if (!find_program("mungekey").empty()) {
    ProcessResult r = run_process({program("mungekey"), "--create", "--keyfile=" + key}, {}, 10s);
    if (!r.exited || r.code != 0)
      throw std::runtime_error("slurm cluster: mungekey failed: " + r.err);
  } else {
    // create-munge-key only writes /etc/munge/munge.key; any 1024 random bytes will do.
    std::ifstream urandom("/dev/urandom", std::ios::binary);
    std::string bytes(1024, '\0');
    urandom.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    write_file(key, bytes);
  }
  chmod(key.c_str(), 0600);

  const std::map<std::string, std::string> daemon_env = env();
  munged_ = std::make_unique<Subprocess>(
      hosts_->on(0, {program("munged"), "--foreground", "--socket=" + dir_ + "/munge.socket",
                     "--key-file=" + key, "--pid-file=" + dir_ + "/munged.pid",
                     "--seed-file=" + dir_ + "/munged.seed", "--log-file=" + dir_ + "/munged.log",
                     "--num-threads=4"}),
      daemon_env);
  const std::string socket = dir_ + "/munge.socket";
  const bool munge_up = poll(
      [&] {
        struct stat st {};
        return !process_alive(munged_->pid()) ||
               (::stat(socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode));
      },
      10s);
  if (!munge_up || !process_alive(munged_->pid())) {
    throw std::runtime_error("slurm cluster: munged did not come up\n" + logs());
  }

  slurmctld_ = std::make_unique<Subprocess>(as_node(0, {program("slurmctld"), "-D", "-f", conf()}),
                                            daemon_env);
  for (int i = 0; i < nodes_; ++i) {
    slurmds_.push_back(std::make_unique<Subprocess>(
        as_node(i, {program("slurmd"), "-D", "-f", conf(), "-N", node_name(i)}), daemon_env));
  }
  wait_until_idle();
}

void SlurmCluster::wait_until_idle() {
  std::string last;
  std::string dead;
  const bool idle = poll(
      [&] {
        if (!process_alive(slurmctld_->pid())) dead = "slurmctld";
        for (int i = 0; i < nodes_; ++i) {
          if (!process_alive(slurmds_[static_cast<size_t>(i)]->pid()))
            dead = "slurmd on " + node_name(i);
        }
        if (!process_alive(munged_->pid())) dead = "munged";
        if (!dead.empty()) return true;
        ProcessResult r = run_process(on_login({"sinfo", "-h", "-N", "-o", "%N %T"}), {}, 10s);
        last = r.out + r.err;
        if (!r.exited || r.code != 0) return false;
        for (int i = 0; i < nodes_; ++i) {
          if (lines_with_prefix(r.out, node_name(i) + " idle").empty()) return false;
        }
        return true;
      },
      30s);
  if (!dead.empty())
    throw std::runtime_error("slurm cluster: " + dead + " exited during bring-up\n" + logs());
  if (!idle) {
    throw std::runtime_error("slurm cluster: nodes not idle after 30 s; sinfo says:\n" + last +
                             "\n" + logs());
  }
}

void SlurmCluster::shutdown() {
  // Jobs first, while the controller is there to end them (bounded).
  if (slurmctld_ && process_alive(slurmctld_->pid())) {
    run_process(on_login({"scancel", "--user=root"}), {}, 10s);
    poll(
        [&] {
          ProcessResult r = run_process(on_login({"squeue", "-h", "-o", "%i"}), {}, 5s);
          return !r.exited || r.code != 0 || r.out.empty();
        },
        10s);
  }
  // Then the daemons: SIGTERM, and SIGKILL (Subprocess::wait) if one lingers.
  std::vector<Subprocess*> slurm;
  for (auto& d : slurmds_) slurm.push_back(d.get());
  if (slurmctld_) slurm.push_back(slurmctld_.get());
  for (Subprocess* d : slurm) {
    if (process_alive(d->pid())) kill(d->pid(), SIGTERM);
  }
  for (Subprocess* d : slurm) d->wait(5s);
  if (munged_) {
    if (process_alive(munged_->pid())) kill(munged_->pid(), SIGTERM);
    munged_->wait(5s);
  }
  // Whatever is left on the test hosts (slurmstepd, tasks that ignored signals).
  if (hosts_) {
    for (int i = 0; i < hosts_->size(); ++i) {
      const std::string ns = hosts_->on(i, {})[3];
      poll(
          [&] {
            std::vector<pid_t> pids = netns_pids(ns);
            for (pid_t pid : pids) kill(pid, SIGKILL);
            return pids.empty();
          },
          5s);
    }
  }
  slurmds_.clear();
  slurmctld_.reset();
  munged_.reset();
  hosts_.reset();
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

std::string SlurmCluster::logs(int lines) const {
  std::string out;
  auto add = [&](const std::string& title, const std::string& text) {
    if (text.empty()) return;
    out += "---- " + title + " (last " + std::to_string(lines) + " lines)\n" + tail(text, lines);
    if (out.back() != '\n') out += "\n";
  };
  if (dir_.empty()) return out;
  if (munged_) {
    // Slurm decodes each credential more than once (and as a uid the credential
    // does not name): munged reports that at Info level on every message.
    std::string munge_log;
    std::stringstream ss(munged_->read_err());
    for (std::string line; std::getline(ss, line);) {
      if (line.find("Unauthorized credential") == std::string::npos &&
          line.find("Replayed credential") == std::string::npos) {
        munge_log += line + "\n";
      }
    }
    add("munged", munge_log);
  }
  // A daemon writes its log file once it has read slurm.conf; before that, only stderr.
  auto add_daemon = [&](const std::string& title, const Subprocess* d, const std::string& file) {
    const std::string log = read_file(dir_ + "/" + file);
    if (!log.empty()) {
      add(file, log);
    } else if (d != nullptr) {
      add(title + " stderr", d->read_err());
    }
  };
  add_daemon("slurmctld", slurmctld_.get(), "slurmctld.log");
  for (size_t i = 0; i < slurmds_.size(); ++i) {
    const std::string name = node_name(static_cast<int>(i));
    add_daemon("slurmd " + name, slurmds_[i].get(), "slurmd-" + name + ".log");
  }
  return out;
}

}  // namespace ddp::testing
