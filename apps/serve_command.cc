// serve: the OpenAI-compatible server. The process the user starts supervises the others: one
// engine core (loads the model, runs the step loop) and N API servers sharing the port. Each is
// this same binary re-run with --role; they talk over ZeroMQ: IPC sockets in a private directory,
// or TCP when the API servers and the engine run on different hosts (--engine-port on the engine's
// side, which may run alone with --api-servers 0; --connect-engine on the API servers' side).
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "apps/commands.h"
#include "base/resident_memory.h"
#include "base/termination.h"
#include "engine/engine.h"
#include "engine/expert_load.h"
#include "model/config.h"
#include "model/expert_parallel.h"
#include "server/api_server.h"
#include "server/engine_core.h"
#include "server/engine_group.h"
#include "dist/communicator.h"
#include "tokenizer/tokenizer.h"

extern char** environ;

namespace moe {
namespace {

struct ServeOptions {
  std::string model = kDefaultModelDir;
  std::string served_model_name;  // default: the model directory's name
  std::string dtype = "w8a8";
  int api_servers = 1;
  int ranks = 1;
  std::string moe_exchange = "all-to-all";
  int shared_expert_ranks = 0;
  bool two_batch_overlap = false;
  ApiServerOptions api;
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  double kv_cache_gib = 1.0;
  int32_t block_size = 16;
  int64_t max_waiting = 1024;
  double shutdown_grace_s = 30;
  double engine_timeout_s = 60;
  double rank_timeout_s = 300;
  std::string engine_host = "127.0.0.1";
  int engine_port = 0;  // 0: IPC sockets, for API servers on this host only
  std::string connect_engine;  // HOST:PORT,...: API servers only, for an engine started elsewhere
  // Internal: which process this is, and where the IPC sockets live.
  std::string role;
  std::string ipc_dir;
};

std::string ServedModelName(const ServeOptions& o) {
  if (!o.served_model_name.empty()) return o.served_model_name;
  return std::filesystem::path(o.model).lexically_normal().filename().string();
}

bool Headless(const ServeOptions& o) { return o.api_servers == 0; }
bool EngineIsRemote(const ServeOptions& o) { return !o.connect_engine.empty(); }

// "HOST:PORT,HOST:PORT,...": one engine rank each, in rank order.
Expected<std::vector<EngineEndpoints>> ParseEngineAddresses(const std::string& list) {
  std::vector<EngineEndpoints> out;
  std::stringstream items(list);
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t colon = item.rfind(':');
    const std::string error = "--connect-engine: '" + item + "' is not HOST:PORT with PORT in 1-65534";
    if (colon == std::string::npos || colon == 0) return Status::Error(error);
    int port = 0;
    const std::string digits = item.substr(colon + 1);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
    if (ec != std::errc() || end != digits.data() + digits.size() || port < 1 || port > 65534) {
      return Status::Error(error);
    }
    out.push_back(TcpEndpoints(item.substr(0, colon), port));
  }
  if (out.empty()) return Status::Error("--connect-engine: no HOST:PORT given");
  return out;
}

// Engine rank r listens on ports engine_port + 2r and + 2r + 1.
EngineEndpoints BindEndpoints(const ServeOptions& o, int rank) {
  if (o.engine_port == 0) return IpcEndpoints(o.ipc_dir, rank);
  return TcpEndpoints(o.engine_host, o.engine_port + 2 * rank);
}

// Where this host's API servers find every rank.
std::vector<EngineEndpoints> ConnectEndpoints(const ServeOptions& o) {
  if (EngineIsRemote(o)) return *ParseEngineAddresses(o.connect_engine);  // checked at start-up
  std::vector<EngineEndpoints> ranks;
  for (int r = 0; r < o.ranks; ++r) {
    if (o.engine_port == 0) {
      ranks.push_back(IpcEndpoints(o.ipc_dir, r));
    } else {
      const bool wildcard = o.engine_host == "0.0.0.0" || o.engine_host == "*";
      ranks.push_back(TcpEndpoints(wildcard ? "127.0.0.1" : o.engine_host, o.engine_port + 2 * r));
    }
  }
  return ranks;
}

// Children end with the supervisor, even when it is killed without a chance to stop them.
void DieWithParent() { prctl(PR_SET_PDEATHSIG, SIGTERM); }

// One engine rank. Rank 0 decides when all stop: on SIGTERM, once `before_stop` (draining the API
// servers, where this rank started them) has returned.
int RunEngine(const ServeOptions& o, Communicator& comm, const std::function<void()>& before_stop) {
  std::atomic<bool> stop{false}, done{false};
  std::thread waiter([&] {
    while (!done.load()) {
      if (WaitForTermination(std::chrono::milliseconds(200)) != 0 && comm.rank() == 0) {
        before_stop();
        stop = true;
      }
    }
  });
  auto finish = [&](int code) {
    done = true;
    waiter.join();
    return code;
  };
  auto dtype = ParseDType(o.dtype);
  if (!dtype.ok()) return finish(Fail(dtype.status()));
  // Several ranks split the experts (expert parallelism): each loads and runs its own.
  auto model_config = LoadModelConfig(o.model + "/config.json");
  if (!model_config.ok()) return finish(Fail(model_config.status()));
  auto placement = ExpertPlacement::Contiguous(model_config->n_routed_experts, comm.size(), o.shared_expert_ranks);
  if ((comm.size() > 1 || o.shared_expert_ranks > 0) && !placement.ok()) return finish(Fail(placement.status()));
  ExpertSelection own_experts;
  if (comm.size() > 1) {
    own_experts.routed = [&](int64_t e) {
      return placement->owner(static_cast<int32_t>(e), comm.rank()) == comm.rank();
    };
    own_experts.shared = o.shared_expert_ranks == 0 || placement->runs_shared_experts(comm.rank());
  }
  auto model = DeepseekV3Model::Load(o.model, *dtype, own_experts);
  if (!model.ok()) return finish(Fail(model.status()));
  EngineConfig config;
  config.block_size = o.block_size;
  config.kv_cache_memory_bytes = static_cast<int64_t>(o.kv_cache_gib * (1 << 30));
  config.scheduler.max_num_seqs = o.max_num_seqs;
  config.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  std::unique_ptr<ExpertBackend> backend;
  if (comm.size() > 1) {
    const MoeExchange exchange =
        o.moe_exchange == "all-gather" ? MoeExchange::kAllGatherReduceScatter : MoeExchange::kAllToAll;
    backend = std::make_unique<ExpertParallelBackend>(comm, *placement, exchange, WireFor(*dtype),
                                                      o.two_batch_overlap ? 2 : 1);
    const std::vector<int32_t> mine = placement->experts_of(comm.rank());
    if (mine.empty()) {
      spdlog::info("engine rank {} of {}: shared experts, no routed experts ({})", comm.rank(), comm.size(),
                   o.moe_exchange);
    } else {
      spdlog::info("engine rank {} of {}: routed experts {}-{} of {}{} ({})", comm.rank(), comm.size(), mine.front(),
                   mine.back(), model_config->n_routed_experts, own_experts.shared ? " and shared experts" : "",
                   o.moe_exchange);
    }
  } else {
    backend = std::make_unique<LocalExpertBackend>();
  }
  spdlog::info("engine rank {} of {}: weights loaded, {:.2f} GiB resident (anonymous)", comm.rank(), comm.size(),
               static_cast<double>(AnonymousResidentBytes()) / (1 << 30));
  ExpertLoadCounter experts(*backend, (*model)->config().first_k_dense_replace);
  Engine engine(**model, experts, config);
  spdlog::info("engine rank {} of {}: KV cache holds {} tokens", comm.rank(), comm.size(), engine.kv_capacity_tokens());
  EngineCoreOptions core;
  core.endpoints = BindEndpoints(o, comm.rank());
  core.info = {ServedModelName(o), (*model)->config().max_position_embeddings,
               static_cast<int32_t>((*model)->config().vocab_size), engine.kv_capacity_tokens()};
  core.max_waiting = o.max_waiting;
  // Tells the supervisor that start-up is over: from now on, an exit is a failure at run time.
  comm.Barrier();
  // Loading takes as long as it takes; from here a rank that stops answering ends the instance.
  comm.SetCollectiveTimeout(std::chrono::milliseconds(static_cast<int64_t>(o.rank_timeout_s * 1000)));
  if (comm.rank() == 0) std::ofstream(o.ipc_dir + "/engine-ready").put('\n');
  const Status status = RunEngineCore(engine, experts, core, comm, stop);
  return finish(status.ok() ? 0 : Fail(status));
}

// Where API server `pid` says it is listening.
std::string ApiReadyFile(const std::string& ipc_dir, pid_t pid) {
  return ipc_dir + "/api-ready-" + std::to_string(pid);
}

int RunApiRole(ServeOptions o) {
  DieWithParent();
  auto tokenizer = Tokenizer::Load(o.model);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  o.api.served_model = ServedModelName(o);
  o.api.shutdown_grace = std::chrono::milliseconds(static_cast<int64_t>(o.shutdown_grace_s * 1000));
  const std::vector<EngineEndpoints> ranks = ConnectEndpoints(o);
  const auto engine_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.engine_timeout_s * 1000));
  EngineGroup engine(ranks, "api-" + std::to_string(getpid()), engine_timeout);
  // A replacement for an API server that died finds the engine up: it connects before it listens,
  // since until then it could only answer 503 to requests the other API servers would serve.
  if (std::filesystem::exists(o.ipc_dir + "/engine-ready")) {
    const auto deadline = std::chrono::steady_clock::now() + engine_timeout;
    while (!engine.info() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  o.api.ready_file = ApiReadyFile(o.ipc_dir, getpid());
  const Status status = RunApiServer(*tokenizer, engine, o.api);
  return status.ok() ? 0 : Fail(status);
}

// The API servers bind the port themselves; trying it first turns "address in use" into one clear
// error instead of API servers failing one after another.
Status CheckCanListen(const std::string& host, int port) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr) {
    return Status::Error("--host: cannot resolve '" + host + "'");
  }
  const int fd = socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  const int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &yes, sizeof(yes));
  const bool bound = fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 && listen(fd, 1) == 0;
  const int error = errno;
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  if (!bound) return Status::Error("cannot listen on " + where + ": " + std::strerror(error));
  return Status::Ok();
}

// The flags that say where the engine is must agree with each other; fills in the ranks of a remote
// engine.
Status CheckTransport(ServeOptions& o) {
  if (!EngineIsRemote(o)) {
    if (o.engine_port != 0 && o.engine_port + 2 * o.ranks - 1 > 65535) {
      return Status::Error("--engine-port: " + std::to_string(o.ranks) + " ranks need ports up to " +
                           std::to_string(o.engine_port + 2 * o.ranks - 1) + ", beyond 65535");
    }
    if (Headless(o) && o.engine_port == 0) {
      return Status::Error("--api-servers 0: the engine needs --engine-port for API servers to reach it");
    }
    return Status::Ok();
  }
  if (Headless(o)) return Status::Error("--connect-engine runs only API servers: --api-servers must be at least 1");
  if (o.engine_port != 0 || o.ranks != 1) {
    return Status::Error("--connect-engine: the engine runs elsewhere, so --engine-port and --ranks do not apply");
  }
  auto ranks = ParseEngineAddresses(o.connect_engine);
  if (!ranks.ok()) return ranks.status();
  o.ranks = static_cast<int>(ranks->size());
  return Status::Ok();
}

// The command line of a child: the user's, with its role and the IPC directory.
std::vector<std::string> WithRole(const std::vector<std::string>& argv, const std::string& role,
                                  const std::string& ipc_dir) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--role" || argv[i] == "--ipc-dir") {
      ++i;
    } else {
      out.push_back(argv[i]);
    }
  }
  out.insert(out.end(), {"--role", role, "--ipc-dir", ipc_dir});
  return out;
}

class Supervisor {
 public:
  Supervisor(const ServeOptions& o, std::vector<std::string> argv) : options_(o), argv_(std::move(argv)) {}

  int Run() {
    char pattern[] = "/tmp/moe-serve-XXXXXX";
    if (!mkdtemp(pattern)) return Fail(Status::Error("cannot create a directory for the IPC sockets in /tmp"));
    ipc_dir_ = pattern;
    owns_ipc_dir_ = true;
    if (!EngineIsRemote(options_)) engine_pid_ = options_.ranks > 1 ? SpawnRanks() : Spawn("engine");
    return Supervise();
  }

  // Only the API servers, for an engine that mpirun started (rank 0 is this process's parent).
  int RunApiServers() {
    ipc_dir_ = options_.ipc_dir;
    return Supervise();
  }

 private:
  int Supervise() {
    for (int i = 0; i < options_.api_servers; ++i) SpawnApiServer();
    if (Headless(options_)) {
      spdlog::info("running the engine of {} without API servers (they connect with --connect-engine)",
                   ServedModelName(options_));
    } else {
      spdlog::info("serving {} on http://{}:{} with {} API server(s){}", ServedModelName(options_),
                   options_.api.host, options_.api.port, options_.api_servers,
                   EngineIsRemote(options_) ? " for the engine at " + options_.connect_engine : "");
    }
    while (failure_.empty() && WaitForTermination(std::chrono::milliseconds(200)) == 0) Reap();
    Shutdown();
    if (owns_ipc_dir_) std::filesystem::remove_all(ipc_dir_);
    // The child printed its own 'error:' line; this one only says what it meant for the server.
    if (!failure_.empty()) {
      spdlog::error("{}", failure_);
      return 1;
    }
    return 0;
  }

  pid_t Spawn(const std::string& role) { return Run("/proc/self/exe", WithRole(argv_, role, ipc_dir_)); }

  // The engine ranks as one MPI job on this host; mpirun's exit is the engine's.
  pid_t SpawnRanks() {
    std::vector<std::string> args = {"mpirun", "-np", std::to_string(options_.ranks)};
    if (geteuid() == 0) args.push_back("--allow-run-as-root");
    args.push_back("--oversubscribe");  // ranks are processes here, not cores
    // Ranks share this machine's cores: each gets its share of threads unless the user chose.
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const std::string threads = std::to_string(std::max(1u, cores / static_cast<unsigned>(options_.ranks)));
    for (const char* name : {"OMP_NUM_THREADS", "MOE_NUM_THREADS"}) {
      args.insert(args.end(), {"-x", std::string(name) + "=" + (std::getenv(name) ? std::getenv(name) : threads)});
    }
    const std::vector<std::string> engine = WithRole(argv_, "engine", ipc_dir_);
    args.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
    args.insert(args.end(), engine.begin() + 1, engine.end());
    return Run("mpirun", args);
  }

  static pid_t Run(const std::string& program, std::vector<std::string> args) {
    std::vector<char*> c_args;
    for (std::string& a : args) c_args.push_back(a.data());
    c_args.push_back(nullptr);
    // The child starts with no signal blocked: this process blocks SIGTERM to wait for it, and
    // mpirun, which is not ours, would inherit that and never hear the supervisor's SIGTERM (our
    // own binary blocks it again first thing).
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    pid_t pid = -1;
    const int error = program.find('/') == std::string::npos
                          ? posix_spawnp(&pid, program.c_str(), nullptr, &attr, c_args.data(), environ)
                          : posix_spawn(&pid, program.c_str(), nullptr, &attr, c_args.data(), environ);
    posix_spawnattr_destroy(&attr);
    if (error != 0) {
      spdlog::error("cannot start {}: {}", program, std::strerror(error));
      return -1;
    }
    return pid;
  }

  void SpawnApiServer() {
    const pid_t pid = Spawn("api");
    if (pid > 0) api_pids_.insert(pid);
  }

  // An API server that died is replaced: the others kept serving meanwhile. The engine is not:
  // the API servers answer 503 until the instance is restarted (see the README).
  void Reap() {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      const std::string how = WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                                  : "exited with status " + std::to_string(WEXITSTATUS(status));
      if (pid == engine_pid_) {
        engine_pid_ = -1;
        if (!std::filesystem::exists(ipc_dir_ + "/engine-ready")) {
          failure_ = "the engine process " + how + " while starting (its error is above)";
        } else if (Headless(options_)) {
          failure_ = "the engine process " + how;
        } else {
          spdlog::error("the engine process {}; the API servers answer 503 until the server is restarted", how);
        }
      } else if (auto it = api_pids_.find(pid); it != api_pids_.end()) {
        // One that dies before it listens would only die again: a start-up error, not a crash.
        const std::string ready = ApiReadyFile(ipc_dir_, pid);
        if (!std::filesystem::exists(ready)) {
          failure_ = "an API server " + how + " while starting (its error is above)";
        } else {
          std::filesystem::remove(ready);
          spdlog::error("API server {} {}; starting a new one", pid, how);
          SpawnApiServer();
        }
        api_pids_.erase(it);
      }
    }
  }

  // API servers first, so that they drain their requests while the engine still runs.
  void Shutdown() {
    spdlog::info("shutting down");
    for (pid_t pid : api_pids_) kill(pid, SIGTERM);
    const auto grace = std::chrono::milliseconds(static_cast<int64_t>(options_.shutdown_grace_s * 1000));
    for (pid_t pid : api_pids_) WaitOrKill(pid, grace + std::chrono::seconds(5));
    if (engine_pid_ > 0) {
      kill(engine_pid_, SIGTERM);
      WaitOrKill(engine_pid_, std::chrono::seconds(10));
    }
  }

  static void WaitOrKill(pid_t pid, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid, nullptr, WNOHANG) != 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    spdlog::warn("process {} did not stop in time; killing it", pid);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }

  const ServeOptions& options_;
  const std::vector<std::string> argv_;
  std::string ipc_dir_;
  bool owns_ipc_dir_ = false;
  pid_t engine_pid_ = -1;
  std::set<pid_t> api_pids_;
  std::string failure_;  // set when the server cannot go on
};

// `mpirun -np N moe-serve serve ...`: every process is an engine rank; rank 0 also starts the
// supervisor of the API servers (outside the MPI job) and drains it before the ranks stop.
int RunUnderMpirun(ServeOptions o, const std::vector<std::string>& argv) {
  const std::unique_ptr<Communicator> comm = MakeMpiCommunicator();
  std::string dir;
  if (comm->rank() == 0) {
    char pattern[] = "/tmp/moe-serve-XXXXXX";
    if (mkdtemp(pattern)) dir = pattern;
  }
  // Rank 0's directory name, to every rank.
  const std::vector<int64_t> lengths = comm->AllGather(static_cast<int64_t>(dir.size()));
  std::string shared(lengths[0], '\0');
  std::vector<int64_t> counts(comm->size(), 0);
  counts[0] = lengths[0];
  comm->AllGatherV({reinterpret_cast<const uint8_t*>(dir.data()), dir.size()},
                   {reinterpret_cast<uint8_t*>(shared.data()), shared.size()}, counts);
  if (shared.empty()) return Fail(Status::Error("cannot create a directory for the IPC sockets in /tmp"));
  o.ipc_dir = shared;
  o.ranks = comm->size();
  pid_t api = -1;
  if (comm->rank() == 0 && !Headless(o)) {
    std::vector<std::string> args = WithRole(argv, "api-supervisor", o.ipc_dir);
    args.insert(args.end(), {"--ranks", std::to_string(o.ranks)});
    std::vector<char*> c_args;
    for (std::string& a : args) c_args.push_back(a.data());
    c_args.push_back(nullptr);
    if (posix_spawn(&api, "/proc/self/exe", nullptr, nullptr, c_args.data(), environ) != 0) api = -1;
  }
  auto drain_api_servers = [&] {
    if (api <= 0) return;
    kill(api, SIGTERM);
    waitpid(api, nullptr, 0);
    api = -1;
  };
  const int code = RunEngine(o, *comm, drain_api_servers);
  if (comm->rank() == 0) {
    drain_api_servers();
    std::filesystem::remove_all(o.ipc_dir);
  }
  return code;
}

}  // namespace

CommandRunner AddServeCommand(CLI::App& app, std::vector<std::string> argv) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)");
  cmd->add_option("--model", o->model, "model directory")->capture_default_str();
  cmd->add_option("--served-model-name", o->served_model_name, "the model name clients use (default: the directory's name)");
  cmd->add_option("--dtype", o->dtype, "f32, bf16 or w8a8")->capture_default_str();
  cmd->add_option("--host", o->api.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", o->api.port, "port to listen on")->capture_default_str()->check(CLI::Range(1, 65535));
  cmd->add_option("--api-servers", o->api_servers,
                  "API-server processes sharing the port; 0 runs only the engine, for API servers started "
                  "elsewhere with --connect-engine")
      ->capture_default_str()->check(CLI::Range(0, 64));
  cmd->add_option("--ranks", o->ranks,
                  "engine ranks (MPI processes started with mpirun): data-parallel attention with one KV cache "
                  "each, routed experts split over the ranks")
      ->capture_default_str()->check(CLI::Range(1, 256));
  cmd->add_option("--moe-exchange", o->moe_exchange,
                  "how tokens reach the ranks owning their experts when there are several: all-to-all, or "
                  "all-gather (every rank gathers every token, results come back by reduce-scatter)")
      ->capture_default_str()->check(CLI::IsMember({"all-to-all", "all-gather"}));
  cmd->add_option("--engine-port", o->engine_port,
                  "serve API servers on other hosts over TCP: engine rank r listens on this port + 2r and + 2r+1 "
                  "(unauthenticated: expose it to a private network only); 0 keeps IPC sockets")
      ->capture_default_str()->check(CLI::Range(0, 65534));
  cmd->add_option("--engine-host", o->engine_host, "address the engine's TCP ports bind (0.0.0.0: every interface)")
      ->capture_default_str();
  cmd->add_option("--connect-engine", o->connect_engine,
                  "run only API servers, for an engine started elsewhere with --engine-port: HOST:PORT of each "
                  "of its ranks, comma-separated, in rank order");
  cmd->add_flag("--two-batch-overlap", o->two_batch_overlap,
               "with several ranks, run each step as two micro-batches so that one's expert exchange travels "
               "while the other's attention and experts compute");
  cmd->add_option("--shared-expert-ranks", o->shared_expert_ranks,
                  "ranks that run only the shared experts, for the tokens of the others (the CM384 layout); 0: "
                  "shared experts on every rank")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--api-key", o->api.api_key, "require 'Authorization: Bearer KEY' on /v1 and /metrics");
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "requests in the running batch")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "tokens per engine step")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--kv-cache-memory", o->kv_cache_gib, "GiB of latent KV cache")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--block-size", o->block_size, "tokens per KV-cache block")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-waiting", o->max_waiting, "waiting requests beyond which new ones get 429")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-body-bytes", o->api.max_body_bytes, "largest request body (413 beyond)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-n", o->api.max_n, "largest n (choices per request)")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--shutdown-grace", o->shutdown_grace_s, "seconds in-flight requests get after SIGTERM")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--engine-timeout", o->engine_timeout_s,
                  "seconds of engine silence after which it counts as gone (503)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--rank-timeout", o->rank_timeout_s,
                  "seconds a rank waits in one collective for the others before it ends the instance (a rank "
                  "hung or gone); longer than the slowest layer of the largest step")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--role", o->role)->group("")->check(CLI::IsMember({"engine", "api", "api-supervisor"}));
  cmd->add_option("--ipc-dir", o->ipc_dir)->group("");
  return [o, argv = std::move(argv)] {
    if (o->role == "engine") {
      DieWithParent();
      const std::unique_ptr<Communicator> comm = MakeMpiCommunicator();  // a world of one without mpirun
      return RunEngine(*o, *comm, [] {});
    }
    if (o->role == "api") return RunApiRole(*o);
    if (o->role == "api-supervisor") {
      DieWithParent();
      Supervisor supervisor(*o, argv);
      return supervisor.RunApiServers();
    }
    if (!std::filesystem::is_directory(o->model)) {
      return Fail(Status::Error("--model: '" + o->model + "' is not a directory"));
    }
    if (auto dtype = ParseDType(o->dtype); !dtype.ok()) return Fail(dtype.status());
    if (Status s = CheckTransport(*o); !s.ok()) return Fail(s);
    // The children would each report a broken model directory; checking the cheap parts here
    // gives one error line instead of one per process.
    if (auto config = LoadModelConfig(o->model + "/config.json"); !config.ok()) return Fail(config.status());
    if (auto tokenizer = Tokenizer::Load(o->model); !tokenizer.ok()) return Fail(tokenizer.status());
    const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");  // set by mpirun
    if (mpi_rank && o->ranks != 1) return Fail(Status::Error("--ranks: not under mpirun, whose -np sets the ranks"));
    if ((!mpi_rank || std::string(mpi_rank) == "0") && !Headless(*o)) {
      if (Status s = CheckCanListen(o->api.host, o->api.port); !s.ok()) return Fail(s);
    }
    if (mpi_rank) return RunUnderMpirun(*o, argv);
    Supervisor supervisor(*o, argv);
    return supervisor.Run();
  };
}

}  // namespace moe
