/* The pod sandbox's process: sleeps until SIGTERM/SIGINT, reaps children (as Kubernetes' pause). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction q = {.sa_handler = quit}, r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &q, NULL); sigaction(SIGTERM, &q, NULL); sigaction(SIGCHLD, &r, NULL);
  for (;;) pause();
}
