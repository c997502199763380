#pragma once
// What every AMX kernel needs: the process's permission to use the tiles and a thread's tile
// configuration (every tile 16 rows x 64 bytes).

#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} TileConfig;

// Per thread, before its first tile instruction: the configuration is a thread's state.
static void configure_tiles(void) {
  TileConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
}

// Linux hands out AMX state on request; the permission is the process's, asked once.
static int request_tiles(void) {
  static int status = -1;
  if (status < 0) status = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0;
  return status;
}
