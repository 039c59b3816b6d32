/* The native floor: what a front end with no interpreter per request could reach (issue 17).
 *
 * A benchmark instrument, not part of the product, built and loaded by native_floor.py.
 * One pthread runs an epoll loop on 127.0.0.1 that reads perf_analyzer's binary HTTP/1.1
 * infer requests for one fixed-shape model, copies each request's input bytes into a slot of a
 * preallocated ring, and answers each request once its batch is done. A Python thread calls
 * nf_wait_batch() through ctypes (the GIL released), runs the model on the slots, writes the
 * outputs into the output ring and calls nf_done(). Every other request (metadata, config,
 * statistics) is forwarded, blocking, to a real worker. The batch rule is the dynamic batcher's:
 * `target` requests, or whatever is queued `delay_us` after the instance started waiting on the
 * first one. Requests that are not infer requests of exactly the configured input size, or do not
 * fit the buffers, close their connection.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_FD 4096
#define RING 64
#define BUF 65536

typedef struct {
  int fd;
  int len;
  char buf[BUF + 1];
} conn_t;

static conn_t *conns[MAX_FD];
static int ep, listen_fd, done_pipe[2], backend_port, backend_fd = -1;
static long target, delay_us, in_bytes, out_bytes;
static char *in_ring, *out_ring;
static int slot_fd[RING];
static long head, tail, taken;        /* answered <= taken <= queued */
static long done_sizes[RING], done_head, done_tail;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static char response_head[512], response_json[1024];
static int head_len, json_len;

static void drop(int fd) {
  epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
  close(fd);
  free(conns[fd]);
  conns[fd] = NULL;
}

static long header_value(const char *headers, const char *name) {
  const char *at = strcasestr(headers, name);
  return at ? atol(at + strlen(name)) : -1;
}

static int forward(conn_t *c, int length) { /* rare requests: to the real worker, blocking */
  static char reply[1 << 20];
  if (backend_fd < 0) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(backend_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    backend_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(backend_fd, (struct sockaddr *)&a, sizeof a) != 0) return -1;
  }
  if (write(backend_fd, c->buf, length) != length) return -1;
  int n = 0;
  for (;;) {
    int r = read(backend_fd, reply + n, sizeof reply - 1 - n);
    if (r <= 0) return -1;
    n += r;
    reply[n] = 0;
    char *end = memmem(reply, n, "\r\n\r\n", 4);
    if (end) {
      *end = 0;
      long body = header_value(reply, "\ncontent-length:");
      *end = '\r';
      if (n >= end - reply + 4 + (body < 0 ? 0 : body)) break;
    }
  }
  return write(c->fd, reply, n) == n ? 0 : -1;
}

/* Consume every complete request in c's buffer; -1 closes the connection. */
static int handle(conn_t *c) {
  for (;;) {
    c->buf[c->len] = 0;
    char *end = memmem(c->buf, c->len, "\r\n\r\n", 4);
    if (!end) return c->len < BUF ? 0 : -1;
    int header = end - c->buf + 4;
    *end = 0;
    long body = header_value(c->buf, "\ncontent-length:");
    long json = header_value(c->buf, "\ninference-header-content-length:");
    int infer = strncmp(c->buf, "POST ", 5) == 0 && strstr(c->buf, "/infer ") != NULL;
    *end = '\r';
    if (body < 0) body = 0;
    if (header + body > BUF) return -1;
    if (c->len < header + body) return 0;
    if (infer) {
      if (json < 0 || json + in_bytes != body) return -1;
      pthread_mutex_lock(&mu);
      if (tail - head >= RING) {
        pthread_mutex_unlock(&mu);
        return -1;
      }
      long slot = tail % RING;
      memcpy(in_ring + slot * in_bytes, c->buf + header + json, in_bytes);
      slot_fd[slot] = c->fd;
      tail++;
      pthread_cond_signal(&cv);
      pthread_mutex_unlock(&mu);
    } else if (forward(c, header + body) != 0) {
      return -1;
    }
    c->len -= header + body;
    memmove(c->buf, c->buf + header + body, c->len);
  }
}

static void answer(long count) {
  for (long k = head; k < head + count; k++) {
    long slot = k % RING;
    struct iovec v[3] = {{response_head, head_len},
                         {response_json, json_len},
                         {out_ring + slot * out_bytes, out_bytes}};
    if (conns[slot_fd[slot]] && writev(slot_fd[slot], v, 3) < 0) drop(slot_fd[slot]);
  }
  pthread_mutex_lock(&mu);
  head += count;
  pthread_mutex_unlock(&mu);
}

static void *loop(void *unused) {
  (void)unused;
  struct epoll_event events[64];
  for (;;) {
    int n = epoll_wait(ep, events, 64, -1);
    for (int i = 0; i < n; i++) {
      int fd = events[i].data.fd;
      if (fd == listen_fd) {
        int c = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK);
        if (c < 0) continue;
        if (c >= MAX_FD) {
          close(c);
          continue;
        }
        int one = 1;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conns[c] = calloc(1, sizeof(conn_t));
        conns[c]->fd = c;
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
      } else if (fd == done_pipe[0]) {
        char bytes[RING];
        if (read(done_pipe[0], bytes, sizeof bytes) <= 0) continue;
        for (;;) {
          pthread_mutex_lock(&mu);
          long count = done_head < done_tail ? done_sizes[done_head++ % RING] : 0;
          pthread_mutex_unlock(&mu);
          if (!count) break;
          answer(count);
        }
      } else if (conns[fd]) {
        conn_t *c = conns[fd];
        int r = read(fd, c->buf + c->len, BUF - c->len);
        if (r <= 0) {
          drop(fd);
          continue;
        }
        c->len += r;
        if (handle(c) != 0) drop(fd);
      }
    }
  }
  return NULL;
}

/* Listen on 127.0.0.1:port; returns 0, or -1 when the port cannot be bound. */
int nf_start(int port, int backend, long batch, long delay, long input_bytes, long output_bytes,
             const char *model, const char *output_name, const char *datatype, long per_request) {
  backend_port = backend;
  target = batch;
  delay_us = delay;
  in_bytes = input_bytes;
  out_bytes = output_bytes;
  in_ring = calloc(RING, in_bytes);
  out_ring = calloc(RING, out_bytes);
  json_len = snprintf(response_json, sizeof response_json,
                      "{\"model_name\":\"%s\",\"model_version\":\"1\",\"outputs\":[{\"name\":\"%s\","
                      "\"datatype\":\"%s\",\"shape\":[1,%ld],\"parameters\":{\"binary_data_size\":%ld}}]}",
                      model, output_name, datatype, per_request, out_bytes);
  head_len = snprintf(response_head, sizeof response_head,
                      "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                      "Inference-Header-Content-Length: %d\r\nContent-Length: %ld\r\n\r\n",
                      json_len, json_len + out_bytes);
  listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  int one = 1;
  setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listen_fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(listen_fd, 128) != 0) return -1;
  ep = epoll_create1(0);
  if (pipe(done_pipe) != 0) return -1;
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = listen_fd};
  epoll_ctl(ep, EPOLL_CTL_ADD, listen_fd, &ev);
  struct epoll_event done = {.events = EPOLLIN, .data.fd = done_pipe[0]};
  epoll_ctl(ep, EPOLL_CTL_ADD, done_pipe[0], &done);
  pthread_t thread;
  return pthread_create(&thread, NULL, loop, NULL) == 0 ? 0 : -1;
}

/* The next batch: its first ring slot, its size in *count (slots wrap modulo the ring). */
long nf_wait_batch(long *count) {
  pthread_mutex_lock(&mu);
  while (tail == taken) pthread_cond_wait(&cv, &mu);
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_nsec += delay_us * 1000;
  deadline.tv_sec += deadline.tv_nsec / 1000000000;
  deadline.tv_nsec %= 1000000000;
  while (tail - taken < target && pthread_cond_timedwait(&cv, &mu, &deadline) == 0) {
  }
  long n = tail - taken < target ? tail - taken : target;
  long first = taken % RING;
  taken += n;
  pthread_mutex_unlock(&mu);
  *count = n;
  return first;
}

void *nf_inputs(void) { return in_ring; }
void *nf_outputs(void) { return out_ring; }
long nf_ring(void) { return RING; }

/* The batch taken first and not yet done has its outputs in the output ring. */
void nf_done(long count) {
  pthread_mutex_lock(&mu);
  done_sizes[done_tail++ % RING] = count;
  pthread_mutex_unlock(&mu);
  if (write(done_pipe[1], "x", 1) != 1) perror("native floor: done pipe");
}
