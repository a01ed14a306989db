/* net/notify: the systemd service notification protocol, without libsystemd.
 *
 * One datagram per state change ("READY=1", "WATCHDOG=1", "STOPPING=1",
 * "STATUS=...") to the AF_UNIX socket named by $NOTIFY_SOCKET: a path, or
 * '@' for the abstract namespace. With no $NOTIFY_SOCKET (not run by systemd)
 * every call is a successful no-op. */
#ifndef SD_NET_NOTIFY_H
#define SD_NET_NOTIFY_H

#include <stdint.h>

#include "core/err.h"

/* Returns 1 when sent, 0 when there is no $NOTIFY_SOCKET, or a negative
 * SD_E* code (bad address, send failed). */
int sd_notify_send(const char *state, sd_err *err);
/* The watchdog interval systemd expects pings within ($WATCHDOG_USEC, when
 * $WATCHDOG_PID is unset or names this process), in microseconds; 0: none. */
uint64_t sd_notify_watchdog_usec(void);
/* sd_notify_send, a failure logged as a warning (a state change is never
 * worth stopping for) */
void sd_notify_state(const char *state);

#endif
