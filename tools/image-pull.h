/* image-pull.h - `dsec image pull`: pull an image from a registry into a layer registry. */
#ifndef DSEC_TOOLS_IMAGE_PULL_H
#define DSEC_TOOLS_IMAGE_PULL_H

/* argv from "pull" on; returns the exit code: 0 pulled, 1 the pull failed,
 * 2 usage or environment error (cli.h's convention). */
int dsec__cli_image_pull(int argc, char **argv);

#endif
