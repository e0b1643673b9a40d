/* The subcommands of the relaymoe program (relaymoe.c hands over to them).
 * Each owns its options, parses argv[first..argc) and returns the process
 * exit code: 0; 2 when the options, or a file they name, are wrong; 1 on
 * any other failure. */
#ifndef RMOE_APP_H
#define RMOE_APP_H

int rmoe_cmd_run(int argc, char **argv, int first);
int rmoe_cmd_train(int argc, char **argv, int first);
int rmoe_cmd_plan(int argc, char **argv, int first);

#endif
