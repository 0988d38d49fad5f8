// The `strata` command line's commands and options as one table (options.cc): which commands take
// which option, and each option's one-line doc. Parsing (strata.cc) checks every option against it,
// and the help (`strata --help`, `strata CMD --help`) is printed from it, so the two cannot disagree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::cli {

// One bit per command, for OptionInfo::commands.
enum CommandBit : uint32_t {
  kRun = 1u << 0,
  kChat = 1u << 1,
  kServe = 1u << 2,
  kLogits = 1u << 3,
  kTokenize = 1u << 4,
  kInspect = 1u << 5,
  kPlan = 1u << 6,
  kBench = 1u << 7,
  kProfile = 1u << 8,
  kPack = 1u << 9,
  kSynth = 1u << 10,
  kPerplexity = 1u << 11,
  kImatrix = 1u << 12,
  kSensitivity = 1u << 13,
};

struct CommandInfo {
  const char *name;
  uint32_t bit;
  int max_positional;     // PATH arguments it takes (inspect, plan: 1; pack: IN OUT [TYPE])
  const char *synopsis;   // after "strata NAME", e.g. "--model PATH --tokens 1,2,3 --out FILE [options]"
  const char *summary;    // one line, for `strata --help`
  const char *description;  // the paragraph under the usage line of `strata NAME --help`
};

struct OptionInfo {
  const char *names;  // the spellings, '|'-separated, long first: "--n-ctx|-c|--ctx-size"
  const char *value;  // the value's placeholder ("PATH", "N"), or nullptr for a switch
  uint32_t commands;  // CommandBit of every command that takes it
  const char *group;  // the heading it is listed under in a command's help
  const char *doc;    // one line
};

const std::vector<CommandInfo> &Commands();
const std::vector<OptionInfo> &Options();

// The command named `name`, or nullptr.
const CommandInfo *FindCommand(const std::string &name);
// The option one of whose spellings is `flag`, or nullptr.
const OptionInfo *FindOption(const std::string &flag);
// Whether `cmd` takes `opt`.
inline bool Takes(const CommandInfo &cmd, const OptionInfo &opt) { return (opt.commands & cmd.bit) != 0; }

// The spellings of an option, split.
std::vector<std::string> Spellings(const OptionInfo &opt);

// The edit distance (insertions, deletions, substitutions, adjacent transpositions) of a and b.
size_t EditDistance(const std::string &a, const std::string &b);
// The known spelling nearest `flag` (those `cmd` takes first, when cmd is given), or "" when none is
// near enough to be a likely typo.
std::string SuggestOption(const std::string &flag, const CommandInfo *cmd);
// The command nearest `name`, or "".
std::string SuggestCommand(const std::string &name);

// `strata --help`: the commands, one line each.
std::string GlobalHelp();
// `strata CMD --help`: CMD's usage, what it does, and every option it takes with its doc.
std::string CommandHelp(const CommandInfo &cmd);
// `strata --version`: the library's version and what this build carries.
std::string VersionText();

}  // namespace strata::cli
