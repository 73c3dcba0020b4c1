#ifndef KVPAGE_TOOLS_PLAN_CLI_H
#define KVPAGE_TOOLS_PLAN_CLI_H
#include <stdio.h>
/* The whole of kvpage-plan; returns the exit status (0 ok, 2 bad usage or
 * input). Separate from main() so tests can run it in-process. */
int kvp_tool_plan(int argc, char **argv, FILE *out, FILE *errf);
#endif
