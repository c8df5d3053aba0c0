// The floor of a "gathering" writer, for docs/performance.md: index tar members (2 threads),
// shuffle the samples, assemble each output shard in memory from random preads of the input and
// write it sequentially (a second thread writes while the next shard is gathered). Not reshard
// and not a tool: no checks, no manifest, no resume; a measurement of what the best such design
// could reach on this machine.
//
//   gcc -O2 -pthread -o /tmp/gather-floor examples/gather-floor.c
//   /tmp/gather-floor INPUT_DIR OUTPUT_DIR SHARDS [WRITE_CHUNK_BYTES]
//
// WRITE_CHUNK_BYTES (default: the whole shard in one write) splits each shard's write.
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct { int file; uint64_t off, len; uint64_t out; } Sample;
static char **names; static int nfiles; static int *fds;
static Sample *samples[2]; static size_t nsamp[2], cap[2];
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static uint64_t octal(const char *p, int n) { uint64_t v = 0; for (int i = 0; i < n && p[i]; i++) if (p[i] >= '0' && p[i] <= '7') v = v * 8 + (p[i] - '0'); return v; }
static void push(int t, Sample s) { if (nsamp[t] == cap[t]) { cap[t] = cap[t] ? cap[t] * 2 : 1 << 16; samples[t] = realloc(samples[t], cap[t] * sizeof(Sample)); } samples[t][nsamp[t]++] = s; }
static size_t keylen(const char *name) { const char *slash = strrchr(name, '/'); const char *base = slash ? slash + 1 : name; const char *dot = strchr(base, '.'); return dot ? (size_t)(dot - name) : strlen(name); }
static void *index_files(void *arg) {
  int t = (int)(intptr_t)arg; enum { W = 8 << 20 }; char *buf = malloc(W + 512);
  for (int f = t; f < nfiles; f += 2) {
    int fd = fds[f]; uint64_t pos = 0, bstart = 0, blen = 0; char key[4096] = "", longname[4096]; int have_long = 0;
    uint64_t sstart = 0; int insample = 0;
    for (;;) {
      if (pos < bstart || pos + 512 > bstart + blen) { bstart = pos; blen = pread(fd, buf, W, pos); if (blen < 512) break; }
      const char *h = buf + (pos - bstart);
      if (h[0] == 0) break;
      uint64_t size = octal(h + 124, 12); char type = h[156]; uint64_t data = pos + 512, next = data + ((size + 511) & ~511ULL);
      if (type == 'L') { pread(fd, longname, size < 4095 ? size : 4095, data); longname[size < 4095 ? size : 4095] = 0; have_long = 1; if (!insample) {} pos = next; continue; }
      char name[4096]; if (have_long) { strcpy(name, longname); have_long = 0; } else { memcpy(name, h, 100); name[100] = 0; }
      size_t kl = keylen(name);
      // the member's first header block: the L header if any (approximate: sample starts at its first header seen)
      if (!insample || strlen(key) != kl || strncmp(key, name, kl)) {
        if (insample) push(t, (Sample){f, sstart, pos - sstart, 0});
        memcpy(key, name, kl); key[kl] = 0; sstart = pos; insample = 1;
      }
      pos = next;
    }
    if (insample) push(t, (Sample){f, sstart, pos - sstart, 0});
  }
  free(buf); return 0;
}
static Sample *all; static size_t n; static int nout; static size_t *shard_first; static uint64_t *shard_bytes;
static char *bufs[2]; static sem_t full[2], empty[2]; static const char *outdir; static uint64_t chunk = 1 << 30;
static void *writer(void *arg) {
  (void)arg;
  for (int s = 0; s < nout; s++) {
    sem_wait(&full[s & 1]);
    char path[4096]; snprintf(path, sizeof path, "%s/shard-%06d.tar", outdir, s);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint64_t left = shard_bytes[s] + 1024, done = 0; while (left) { ssize_t w = write(fd, bufs[s & 1] + done, left > chunk ? chunk : left); if (w <= 0) { perror("write"); exit(1); } done += w; left -= w; }
    close(fd); sem_post(&empty[s & 1]);
  }
  return 0;
}
int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "gather IN OUT NSHARDS\n"); return 2; }
  double t0 = now();
  struct dirent **ents; int ne = scandir(argv[1], &ents, 0, alphasort);
  names = malloc(ne * sizeof *names); fds = malloc(ne * sizeof *fds);
  for (int i = 0; i < ne; i++) if (strstr(ents[i]->d_name, ".tar")) { char p[4096]; snprintf(p, sizeof p, "%s/%s", argv[1], ents[i]->d_name); names[nfiles] = strdup(p); fds[nfiles++] = open(p, O_RDONLY); }
  pthread_t th[2]; for (int t = 0; t < 2; t++) pthread_create(&th[t], 0, index_files, (void *)(intptr_t)t);
  for (int t = 0; t < 2; t++) pthread_join(th[t], 0);
  n = nsamp[0] + nsamp[1]; all = malloc(n * sizeof *all); memcpy(all, samples[0], nsamp[0] * sizeof *all); memcpy(all + nsamp[0], samples[1], nsamp[1] * sizeof *all);
  double t1 = now();
  uint64_t x = 88172645463325252ULL; for (size_t i = n - 1; i > 0; i--) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; size_t j = x % (i + 1); Sample tmp = all[i]; all[i] = all[j]; all[j] = tmp; }
  nout = atoi(argv[3]); outdir = argv[2]; if (argc > 4) chunk = strtoull(argv[4], 0, 10); mkdir(outdir, 0755);
  shard_first = calloc(nout + 1, sizeof *shard_first); shard_bytes = calloc(nout, sizeof *shard_bytes); uint64_t maxb = 0;
  for (int s = 0; s <= nout; s++) shard_first[s] = n * s / nout;
  for (int s = 0; s < nout; s++) { uint64_t b = 0; for (size_t i = shard_first[s]; i < shard_first[s + 1]; i++) { all[i].out = b; b += all[i].len; } shard_bytes[s] = b; if (b > maxb) maxb = b; }
  double t2 = now();
  for (int i = 0; i < 2; i++) { bufs[i] = malloc(maxb + 1024); sem_init(&full[i], 0, 0); sem_init(&empty[i], 0, 1); }
  pthread_t w; pthread_create(&w, 0, writer, 0);
  for (int s = 0; s < nout; s++) {
    sem_wait(&empty[s & 1]); char *b = bufs[s & 1];
    for (size_t i = shard_first[s]; i < shard_first[s + 1]; i++) if (pread(fds[all[i].file], b + all[i].out, all[i].len, all[i].off) != (ssize_t)all[i].len) { perror("pread"); return 1; }
    memset(b + shard_bytes[s], 0, 1024);
    sem_post(&full[s & 1]);
  }
  pthread_join(w, 0);
  double t3 = now();
  fprintf(stderr, "%zu samples, %d files: index %.2f s, plan %.2f s, gather+write %.2f s, total %.2f s\n", n, nfiles, t1 - t0, t2 - t1, t3 - t2, t3 - t0);
  return 0;
}
