#include "plan_cli.h"

int main(int argc, char **argv) { return kvp_tool_plan(argc, argv, stdout, stderr); }
