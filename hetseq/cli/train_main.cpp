#include "hetseq/cli/train_command.h"

int main(int argc, char* argv[]) { return hetseq::cli::train_main(argc, argv); }
