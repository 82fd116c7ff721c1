// `trainer`: the command line. Subcommands train, eval, plan, simulate, info, export, jobs and
// config; every error a user can cause, command-line parse errors included, ends in one line
// saying what is wrong and one saying what to change, with exit code 2 (bad input:
// exit_code_for) or 1 (a failure while running).
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "comm/fault.h"
#include "comm/ranks.h"
#include "common/error.h"
#include "trainer/cli/commands.h"

int main(int argc, char** argv) {
  using namespace ferry;
  CLI::App app{
      "ferry: a multi-GPU, data-parallel trainer that offloads activations to host "
      "memory (vDNN) and schedules the PCIe traffic by topology"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ferry 0.1.0");

  TrainArgs train;
  CLI::App* train_cmd =
      app.add_subcommand("train", "Train a model: trainer train CONFIG [key=value ...]");
  train_cmd->add_option("config", train.config, "YAML experiment config")->required();
  train_cmd->add_option("overrides", train.overrides, "key=value overrides, e.g. optim.lr=0.05");

  TrainArgs eval;
  CLI::App* eval_cmd = app.add_subcommand(
      "eval", "Loss and accuracy over the configured dataset: trainer eval CONFIG [key=value ...]");
  eval_cmd->add_option("config", eval.config, "YAML experiment config")->required();
  eval_cmd->add_option("overrides", eval.overrides, "key=value overrides");

  PlanArgs plan;
  CLI::App* plan_cmd = app.add_subcommand(
      "plan", "Plan device memory without training: trainer plan CONFIG [key=value ...]");
  plan_cmd->add_option("config", plan.config, "YAML experiment config")->required();
  plan_cmd->add_option("overrides", plan.overrides, "key=value overrides");
  plan_cmd->add_option("--policy", plan.policy,
                       "none, vdnn-conv, vdnn-all, auto, or all to compare them (default: "
                       "memory.policy)");
  plan_cmd->add_option("--hardware", plan.hardware,
                       "plan with a hardware profile's rates: a name (h100-pcie5, v100-pcie3, "
                       "a100-pcie4) or a YAML file");
  plan_cmd
      ->add_option("--gpus", plan.gpus,
                   "with topology.file: ranks sharing its links (default: one per GPU)")
      ->check(CLI::Range(1, 4096));
  plan_cmd
      ->add_option("--ranks", plan.ranks,
                   "data-parallel ranks to plan the model state for (memory.zero), without "
                   "launching them (default 1)")
      ->check(CLI::Range(1, 1 << 20));
  plan_cmd->add_flag("--max-batch", plan.max_batch,
                     "also find the largest batch whose plan fits memory.budget");
  plan_cmd->add_flag("--json", plan.json, "print JSON");
  plan_cmd->add_flag("--explain", plan.explain,
                     "list the largest tensors in the arena at each plan's fullest step");
  plan_cmd->add_flag("--measure", plan.measure,
                     "time the model's kernels and the link on this machine's device and plan "
                     "with them (default on cuda with a GPU present; cached in run.dir)");
  plan_cmd->add_flag("--no-measure", plan.no_measure, "plan with the FLOP model even on a GPU");

  ExportArgs exp;
  CLI::App* export_cmd = app.add_subcommand(
      "export",
      "Write a checkpoint as a Hugging Face model folder: trainer export CHECKPOINT OUT_DIR");
  export_cmd->add_option("checkpoint", exp.checkpoint, "a checkpoint written by trainer train")
      ->required();
  export_cmd->add_option("out_dir", exp.out_dir, "the folder to write")->required();
  export_cmd->add_option(
      "--tokenizer", exp.tokenizer,
      "a folder whose tokenizer files (tokenizer.json, ...) to copy along (default: "
      "the model folder the run started from, when it holds tokenizer.json)");

  TrainArgs check;
  bool reference = false;
  CLI::App* config_cmd = app.add_subcommand(
      "config",
      "Validate a config and print it resolved: trainer config CONFIG [key=value ...]; "
      "--reference prints every key");
  config_cmd->add_option("config", check.config, "YAML experiment config");
  config_cmd->add_option("overrides", check.overrides, "key=value overrides");
  config_cmd->add_flag("--reference", reference, "print the config reference (markdown)");

  InfoArgs info;
  CLI::App* info_cmd =
      app.add_subcommand("info", "Print a model's layers: trainer info --model NAME");
  info_cmd->add_option("--model", info.model, "model name (omit to list the zoo)");
  info_cmd->add_option("--classes", info.classes, "number of classes (default: the model's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  info_cmd->add_option("--input", info.input, "input C,H,W (default: the model's)");
  info_cmd->add_flag("--json", info.json, "print JSON");

  JobsArgs jobs;
  CLI::App* jobs_cmd = app.add_subcommand(
      "jobs",
      "The jobs sharing this node's GPUs (memory.share): per GPU its capacity, per job its pid, "
      "config, run dir, lower bound, share, held memory and step times; and the node's link "
      "ledgers: per link its users (job, pid, rank, bytes in flight): trainer jobs [--json]");
  jobs_cmd->add_flag("--json", jobs.json, "print JSON");

  SimulateArgs sim;
  CLI::App* sim_cmd = app.add_subcommand(
      "simulate",
      "One step of a config on a described server, on a virtual clock: trainer simulate CONFIG "
      "[--topology FILE] [--gpus N] [--nodes N] [--hardware NAME|FILE] [--shapes S:W,...] [--json] "
      "[--trace FILE]; or jobs sharing one GPU over time: trainer simulate --mix FILE "
      "[--hardware NAME|FILE] [--topology FILE] [--json]");
  sim_cmd->add_option("config", sim.config, "YAML experiment config (or --mix FILE)");
  sim_cmd->add_option("overrides", sim.overrides, "key=value overrides");
  sim_cmd->add_option("--topology", sim.topology, "topology file (default: topology.file)");
  sim_cmd->add_option("--gpus", sim.gpus, "GPUs (ranks) to simulate (default: every GPU)")
      ->check(CLI::Range(1, 4096));
  sim_cmd
      ->add_option("--nodes", sim.nodes,
                   "identical nodes the job spans: gradients all-reduce across them through "
                   "the topology's NICs at the profile's network.nic_gbps (default 1)")
      ->check(CLI::Range(1, 1024));
  sim_cmd->add_option("--hardware", sim.hardware,
                      "hardware profile: h100-pcie5, v100-pcie3, a100-pcie4 or a YAML file "
                      "(default: the config's cost model)");
  sim_cmd->add_option("--scheduler", sim.scheduler,
                      "fifo or topology (default: topology.scheduler)");
  sim_cmd
      ->add_option("--chunk-mb", sim.chunk_mb,
                   "topology scheduler chunk size in MiB, in [0.0625, 1024] as topology.chunk_mb "
                   "(default: topology.chunk_mb)")
      ->check(CLI::Range(0.0625, 1024.0));
  sim_cmd->add_option("--planning", sim.planning,
                      "aware or oblivious: how auto plans the link, whatever the scheduler "
                      "(default: aware under topology, oblivious under fifo)");
  sim_cmd->add_flag("--json", sim.json, "print one JSON object");
  sim_cmd->add_option("--trace", sim.trace, "write a Chrome trace of the step to FILE");
  sim_cmd->add_option("--emulated", sim.emulated,
                      "simulate the CPU emulation traced in this run dir (run.trace): its step "
                      "times, links at topology.emulation_scale");
  sim_cmd->add_option("--shapes", sim.shapes,
                      "input shapes to average the step over, SIZE[:WEIGHT],... : image sides, or "
                      "tokens per row of a token model (default: data.scales, else the configured "
                      "input)");
  sim_cmd->add_option("--mix", sim.mix,
                      "instead of CONFIG: a mix file of jobs sharing one GPU, each arriving at its "
                      "time for its steps, under memory.share, a static equal split and one after "
                      "another (see configs/simulate/mix-h100.yaml)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Like every other user error: one line, a hint, exit 2.
    return report_error(ConfigError(e.what(),
                                    "'trainer --help' lists the subcommands, "
                                    "'trainer SUBCOMMAND --help' their options"),
                        2);
  }

  // train runs as one rank of a job (mpirun, or alone); a failure on a rank ends the job.
  if (*train_cmd) {
    RankInfo ranks;
    int code = 0;
    try {
      ranks = init_ranks();
      code = run_train(train, ranks);
    } catch (const std::exception& e) {
      return fail_job(ranks, e, exit_code_for(e));
    }
    finalize_ranks();
    return code;
  }
  try {
    if (launched_by_mpi() && *eval_cmd) {
      throw ConfigError("trainer eval runs as one process", "run it without mpirun");
    }
    if (*eval_cmd) return run_eval(eval);
    if (*plan_cmd) return run_plan(plan);
    if (*sim_cmd) return run_simulate(sim);
    if (*info_cmd) return run_info(info);
    if (*export_cmd) return run_export(exp);
    if (*jobs_cmd) return run_jobs(jobs);
    if (*config_cmd) return run_config(check, reference);
  } catch (const Error& e) {
    return report_error(e, exit_code_for(e));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
