#include "holder/checkpoint.h"
