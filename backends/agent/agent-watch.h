/* agent-watch.h - the agent's directory watcher mode (agent-watch.c). */
#ifndef DSEC_BACKENDS_AGENT_WATCH_H
#define DSEC_BACKENDS_AGENT_WATCH_H

/* `dsec-agent --watch DIR [--recursive]`: argv as main's; returns the exit status. */
int dsec__agent_watch_main(int argc, char **argv);

#endif
