/*
 * kvpage-sim's command line, callable in-process (tests run it like main).
 */
#ifndef KVPAGE_TOOLS_SIM_CLI_H
#define KVPAGE_TOOLS_SIM_CLI_H

#include <stdio.h>

/* Run kvpage-sim with argv; output to `out`, messages to `err`. Returns the
 * exit status: 0, 1 (a run failed), 2 (bad arguments). */
int kvp_tool_sim(int argc, char **argv, FILE *out, FILE *err);

#endif
