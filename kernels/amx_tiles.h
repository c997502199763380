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

// ldtilecfg of cfg, its 64 bytes the asm's operand: GCC 12's _tile_loadconfig names only a
// pointer's 8 bytes as read, so at -O2 it may drop the stores that fill the rest (a stack config
// filled in main then faults).
static inline void load_tile_config(const TileConfig *cfg) {
  __asm__ volatile("ldtilecfg %0" : : "m"(*cfg));
}

// Per thread, before its first tile instruction: the configuration is a thread's state.
static void configure_tiles(void) {
  TileConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  load_tile_config(&cfg);
}

// Linux hands out AMX state on request; the permission is the process's, asked once.
static int request_tiles(void) {
  static int status = -1;
  if (status < 0) status = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0;
  return status;
}
