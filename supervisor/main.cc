// wsup: the command line. Subcommands live in supervisor/cli*.cc.

#include <iostream>
#include <string>
#include <vector>

#include "supervisor/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  return wsup::RunCli(args, std::cout, std::cerr);
}
