/* One non-blocking write of a Unix link message (see _unix_link.py), shared by
 * _fastlink.c (every send) and _fastwire.c (a rank's reply, sealed and written in
 * one step). Include after Python.h. */
#ifndef MONARCH_NB_LINK_SEND_H
#define MONARCH_NB_LINK_SEND_H

#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define UNLOCKED_SEND_MIN ((Py_ssize_t)64 << 10)

/* One non-blocking sendmsg of `whole` bytes, retried on EINTR, without the GIL
 * where the kernel copies MiBs (the other threads run meanwhile): the bytes
 * the kernel did not take (0: all sent), or -errno. */
static Py_ssize_t send_message(int fd, struct msghdr *msg, Py_ssize_t whole) {
    ssize_t sent;
    int err;
    if (whole >= UNLOCKED_SEND_MIN) {
        Py_BEGIN_ALLOW_THREADS
        do
            sent = sendmsg(fd, msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        while (sent < 0 && errno == EINTR);
        err = errno;
        Py_END_ALLOW_THREADS
    } else {
        do
            sent = sendmsg(fd, msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        while (sent < 0 && errno == EINTR);
        err = errno;
    }
    if (sent < 0)
        return err == EAGAIN || err == EWOULDBLOCK ? whole : -(Py_ssize_t)err;
    return whole - (Py_ssize_t)sent;
}

#endif
