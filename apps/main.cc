#include <iostream>

#include "apps/commands.h"
#include "base/heap_reuse.h"
#include "base/log.h"
#include "base/termination.h"

int main(int argc, char** argv) {
  moe::ExecWithHugePageHeap(argv);
  // Before any thread starts, so that every thread inherits the mask (see termination.h).
  moe::BlockTerminationSignals();
  moe::ReuseFreedHeapMemory();
  CLI::App app("moe-serve: serves DeepSeek-V3-architecture Mixture-of-Experts models", "moe-serve");
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging on stderr");

  const moe::CommandRunner generate = moe::AddGenerateCommand(app);
  const moe::CommandRunner tokenize = moe::AddTokenizeCommand(app);
  const moe::CommandRunner perplexity = moe::AddPerplexityCommand(app);
  const moe::CommandRunner bench_offline = moe::AddBenchOfflineCommand(app);
  const moe::CommandRunner bench_serve = moe::AddBenchServeCommand(app);
  const moe::CommandRunner serve = moe::AddServeCommand(app, std::vector<std::string>(argv, argv + argc));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "error: " << e.what() << " (see --help)\n";
    return 2;
  }

  moe::InitLogging(verbose);
  if (app.got_subcommand("generate")) return generate();
  if (app.got_subcommand("tokenize")) return tokenize();
  if (app.got_subcommand("perplexity")) return perplexity();
  if (app.got_subcommand("bench-offline")) return bench_offline();
  if (app.got_subcommand("bench-serve")) return bench_serve();
  if (app.got_subcommand("serve")) return serve();
  return 1;
}
