#include "hetseq/cli/train_command.h"

int main(int argc, char* argv[]) { return hetseq::cli::eval_main(argc, argv); }
