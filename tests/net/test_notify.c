#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "net/notify.h"
#include "test.h"

/* A datagram socket bound at path (abstract when path starts with '@'). */
static int bind_dgram(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@')
        sa.sun_path[0] = 0;
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '@' ? 0 : 1));
    if (bind(fd, (struct sockaddr *)&sa, len)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int recv_str(int fd, char *out, size_t n)
{
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t r = recv(fd, out, n - 1, 0);
    if (r < 0)
        return -1;
    out[r] = 0;
    return 0;
}

TEST(without_notify_socket_nothing_is_sent)
{
    unsetenv("NOTIFY_SOCKET");
    sd_err err = {0};
    ASSERT_EQ(sd_notify_send("READY=1", &err), 0);
}

TEST(states_reach_a_path_socket)
{
    char path[108];
    snprintf(path, sizeof path, "/tmp/specd-notify-%d-%llu", (int)getpid(),
             (unsigned long long)sd_test_seed() % 100000);
    unlink(path);
    int fd = bind_dgram(path);
    ASSERT(fd >= 0);
    setenv("NOTIFY_SOCKET", path, 1);
    sd_err err = {0};
    ASSERT_EQ(sd_notify_send("READY=1", &err), 1);
    ASSERT_EQ(sd_notify_send("STOPPING=1", &err), 1);
    char got[64];
    ASSERT_OK(recv_str(fd, got, sizeof got));
    ASSERT_STR_EQ(got, "READY=1");
    ASSERT_OK(recv_str(fd, got, sizeof got));
    ASSERT_STR_EQ(got, "STOPPING=1");
    close(fd);
    unlink(path);
    /* the socket is gone: an error naming it */
    ASSERT_EQ(sd_notify_send("WATCHDOG=1", &err), SD_EIO);
    ASSERT_CONTAINS(err.msg, path);
    unsetenv("NOTIFY_SOCKET");
}

TEST(states_reach_an_abstract_socket)
{
    char name[64];
    snprintf(name, sizeof name, "@specd-notify-test-%d", (int)getpid());
    int fd = bind_dgram(name);
    ASSERT(fd >= 0);
    setenv("NOTIFY_SOCKET", name, 1);
    sd_err err = {0};
    ASSERT_EQ(sd_notify_send("WATCHDOG=1", &err), 1);
    char got[64];
    ASSERT_OK(recv_str(fd, got, sizeof got));
    ASSERT_STR_EQ(got, "WATCHDOG=1");
    close(fd);
    unsetenv("NOTIFY_SOCKET");
}

TEST(relative_socket_paths_are_refused)
{
    setenv("NOTIFY_SOCKET", "relative/sock", 1);
    sd_err err = {0};
    ASSERT_EQ(sd_notify_send("READY=1", &err), SD_EINVAL);
    ASSERT_CONTAINS(err.msg, "NOTIFY_SOCKET");
    unsetenv("NOTIFY_SOCKET");
}

TEST(watchdog_interval_is_ours_only_when_the_pid_matches)
{
    unsetenv("WATCHDOG_PID");
    unsetenv("WATCHDOG_USEC");
    ASSERT_EQ(sd_notify_watchdog_usec(), 0);
    setenv("WATCHDOG_USEC", "3000000", 1);
    ASSERT_EQ(sd_notify_watchdog_usec(), 3000000);
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    ASSERT_EQ(sd_notify_watchdog_usec(), 3000000);
    snprintf(pid, sizeof pid, "%d", (int)getpid() + 1);
    setenv("WATCHDOG_PID", pid, 1);
    ASSERT_EQ(sd_notify_watchdog_usec(), 0);
    unsetenv("WATCHDOG_PID");
    setenv("WATCHDOG_USEC", "soon", 1);
    ASSERT_EQ(sd_notify_watchdog_usec(), 0);
    unsetenv("WATCHDOG_USEC");
}

TEST_MAIN(T(without_notify_socket_nothing_is_sent), T(states_reach_a_path_socket),
          T(states_reach_an_abstract_socket), T(relative_socket_paths_are_refused),
          T(watchdog_interval_is_ours_only_when_the_pid_matches))
