/*
 * Gantry test pause: the process that holds a pod sandbox's namespaces open.
 *
 * It does nothing but wait. As PID 1 of the pod's PID namespace it must also
 * reap orphans re-parented to it, otherwise they would pile up as zombies.
 * SIGINT/SIGTERM end it cleanly (exit status 0) so a sandbox stop is fast.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_terminate(int sig)
{
	(void)sig;
	_exit(0);
}

static void on_child(int sig)
{
	int saved_errno = errno;

	(void)sig;
	/* One SIGCHLD may stand for several exits: drain them all. */
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved_errno;
}

static int install(int sig, void (*handler)(int), int flags)
{
	struct sigaction action;

	memset(&action, 0, sizeof(action));
	sigemptyset(&action.sa_mask);
	action.sa_handler = handler;
	action.sa_flags = flags;
	return sigaction(sig, &action, NULL);
}

int main(void)
{
	if (install(SIGINT, on_terminate, 0) != 0 ||
	    install(SIGTERM, on_terminate, 0) != 0 ||
	    install(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) != 0)
		return 1;

	for (;;)
		pause();
}
