#include "sim_cli.h"

int main(int argc, char **argv) { return kvp_tool_sim(argc, argv, stdout, stderr); }
