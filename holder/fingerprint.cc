#include "holder/fingerprint.h"
