// Internal: how shardfeed's libjpeg users (decoder.cpp, jpeg_index.cpp) get errors back from
// libjpeg. Fatal errors longjmp to `jump` with the message formatted; warnings (corrupt data
// libjpeg worked around) are counted and the first one kept; a progressive JPEG of more than
// kMaxJpegScans scans is stopped through the progress monitor (a scan bomb).
#pragma once

#include <jpeglib.h>

#include <csetjmp>
#include <cstdio>

#include "shardfeed/imaging/image.h"

namespace shardfeed::imaging {

struct JpegErrors {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  int warnings;

  // Installs these handlers into `cinfo` (and `progress` as its progress monitor).
  template <typename Info>
  void Install(Info* cinfo, jpeg_progress_mgr* progress) {
    cinfo->err = jpeg_std_error(&pub);
    pub.error_exit = OnError;
    pub.emit_message = OnMessage;
    warnings = 0;
    message[0] = 0;
    if (progress) {
      progress->progress_monitor = OnProgress;
      cinfo->progress = progress;
    }
  }

  static void OnError(j_common_ptr cinfo) {
    auto* err = reinterpret_cast<JpegErrors*>(cinfo->err);
    (*cinfo->err->format_message)(cinfo, err->message);
    std::longjmp(err->jump, 1);
  }
  static void OnMessage(j_common_ptr cinfo, int level) {
    auto* err = reinterpret_cast<JpegErrors*>(cinfo->err);
    if (level < 0 && err->warnings++ == 0) (*cinfo->err->format_message)(cinfo, err->message);
  }
  static void OnProgress(j_common_ptr cinfo) {
    auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
    if (d->is_decompressor && d->progressive_mode && d->input_scan_number > kMaxJpegScans) {
      auto* err = reinterpret_cast<JpegErrors*>(cinfo->err);
      std::snprintf(err->message, sizeof(err->message), "progressive JPEG with more than %d scans",
                    kMaxJpegScans);
      std::longjmp(err->jump, 1);
    }
  }
};

}  // namespace shardfeed::imaging
